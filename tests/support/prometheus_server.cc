#include "tests/support/prometheus_server.h"

#include <httplib.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <stdexcept>
#include <thread>

namespace gradhub::testing {
namespace {

using Clock = std::chrono::steady_clock;

// The scrape configuration: one scrape job per target, all at `scrape_interval`.
std::string ScrapeConfig(const PrometheusServerOptions& options) {
  std::string yaml = "global:\n  scrape_interval: " + options.scrape_interval +
                     "\n  evaluation_interval: " + options.scrape_interval + "\nscrape_configs:\n";
  for (const ScrapeTarget& target : options.targets) {
    yaml += "  - job_name: '" + target.job + "'\n    metrics_path: '" + target.metrics_path +
            "'\n    static_configs:\n      - targets: ['" + target.address + "']\n";
  }
  return yaml;
}

bool IsFiniteNumber(const nlohmann::json& value) {
  // A sample is [time, "value"]; Prometheus writes NaN and infinities as "NaN", "+Inf", "-Inf".
  if (!value.is_array() || value.size() != 2 || !value[1].is_string()) return false;
  const std::string text = value[1].get<std::string>();
  char* end = nullptr;
  const double number = std::strtod(text.c_str(), &end);
  return end != text.c_str() && *end == '\0' && std::isfinite(number);
}

PromResult Parse(const httplib::Result& response) {
  PromResult result;
  if (!response) {
    result.error = "no answer from Prometheus: " + httplib::to_string(response.error());
    return result;
  }
  const nlohmann::json body = nlohmann::json::parse(response->body, nullptr, false);
  if (body.is_discarded() || body.value("status", "") != "success") {
    result.error = "HTTP " + std::to_string(response->status) + ": " + response->body;
    return result;
  }
  result.type = body["data"].value("resultType", "");
  result.value = body["data"]["result"];
  if (result.type == "scalar") {
    result.samples = 1;
    result.finite_samples = IsFiniteNumber(result.value) ? 1 : 0;
  } else if (result.value.is_array()) {
    result.samples = result.value.size();
    for (const auto& series : result.value) {
      result.finite_samples += series.contains("value") && IsFiniteNumber(series["value"]) ? 1 : 0;
    }
  }
  return result;
}

}  // namespace

std::string PrometheusServer::BinaryPath() {
  const char* path = std::getenv("GRADHUB_PROMETHEUS");
  return path != nullptr && *path != '\0' ? path : "/usr/bin/prometheus";
}

bool PrometheusServer::Available() { return access(BinaryPath().c_str(), X_OK) == 0; }

PrometheusServer::PrometheusServer(PrometheusServerOptions options)
    : options_(std::move(options)), config_(ScrapeConfig(options_)) {
  std::ofstream(dir_.path() + "/prometheus.yml") << config_;
  for (int attempt = 0; attempt < 3; ++attempt) {
    if (Launch()) return;
  }
  throw std::runtime_error("prometheus did not start; its log:\n" + log());
}

PrometheusServer::~PrometheusServer() = default;  // the Subprocess kills it

std::string PrometheusServer::log() const { return process_ ? process_->err() : ""; }

bool PrometheusServer::Launch() {
  port_ = FreeLoopbackPort();
  process_ = std::make_unique<Subprocess>(std::vector<std::string>{
      BinaryPath(), "--config.file=" + dir_.path() + "/prometheus.yml",
      "--storage.tsdb.path=" + dir_.path() + "/data",
      "--web.listen-address=127.0.0.1:" + std::to_string(port_), "--log.level=warn"});
  httplib::Client client("127.0.0.1", port_);
  client.set_connection_timeout(std::chrono::seconds(1));
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  while (Clock::now() < deadline && process_->running()) {
    if (auto response = client.Get("/-/ready"); response && response->status == 200) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

PromResult PrometheusServer::Query(const std::string& promql) const {
  httplib::Client client("127.0.0.1", port_);
  client.set_read_timeout(std::chrono::seconds(30));
  return Parse(client.Post("/api/v1/query", httplib::Params{{"query", promql}}));
}

PromResult PrometheusServer::AwaitData(const std::string& promql,
                                       std::chrono::milliseconds limit) const {
  const auto deadline = Clock::now() + limit;
  PromResult result = Query(promql);
  while (result.finite_samples == 0 && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
    result = Query(promql);
  }
  return result;
}

bool PrometheusServer::AwaitTargetsUp(std::chrono::milliseconds limit) const {
  const std::string targets = std::to_string(options_.targets.size());
  // Every target has an `up` series, and all of them are 1.
  return AwaitData("count(up == 1) == " + targets, limit).finite_samples == 1;
}

}  // namespace gradhub::testing
