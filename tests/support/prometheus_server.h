// A real Prometheus (Debian's `prometheus` package) for tests: started on a free loopback port
// with a generated scrape config and a temporary storage directory, queried through its HTTP
// API, killed with the object. Tests ask it exactly what Grafana would.
//
//   PrometheusServer prometheus({{"gradhub-metrics", "127.0.0.1:9464"}});
//   prometheus.AwaitTargetsUp(std::chrono::seconds(30));
//   PromResult result = prometheus.Query("sum(gradhub_samples_per_second)");
#pragma once

#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/support/ports.h"
#include "tests/support/subprocess.h"

namespace gradhub::testing {

struct ScrapeTarget {
  std::string job;      // scrape job name, the `job` label of what it scrapes
  std::string address;  // host:port
  std::string metrics_path = "/metrics";
};

struct PrometheusServerOptions {
  std::vector<ScrapeTarget> targets;
  // Short, so that a test has several samples (and rates) within seconds.
  std::string scrape_interval = "1s";
};

// The answer to an instant query.
struct PromResult {
  std::string error;     // non-empty when the query failed (HTTP, parse or PromQL error)
  std::string type;      // "vector", "scalar", "matrix" or "string"
  nlohmann::json value;  // data.result as Prometheus returned it
  // Samples in the result (1 for a scalar); for a vector, those whose value is a number
  // (not NaN or infinite) are counted apart, since a quantile over no observations is NaN.
  size_t samples = 0;
  size_t finite_samples = 0;
};

// Not thread-safe.
class PrometheusServer {
 public:
  // The binary: $GRADHUB_PROMETHEUS, else /usr/bin/prometheus.
  static std::string BinaryPath();
  static bool Available();

  // Starts Prometheus and returns once it answers /-/ready. Throws std::runtime_error with its
  // log when it does not start (it is tried on three free ports, in case another process took
  // the first one between our check and its bind).
  explicit PrometheusServer(PrometheusServerOptions options);
  ~PrometheusServer();
  PrometheusServer(const PrometheusServer&) = delete;
  PrometheusServer& operator=(const PrometheusServer&) = delete;

  int port() const { return port_; }
  // The generated configuration, for failure messages.
  const std::string& config() const { return config_; }
  std::string log() const;

  // An instant query at the current time.
  PromResult Query(const std::string& promql) const;
  // Polls Query(promql) until it has a finite sample or `limit` passes; returns the last answer.
  PromResult AwaitData(const std::string& promql, std::chrono::milliseconds limit) const;
  // True once every target's last scrape succeeded (up == 1 for each).
  bool AwaitTargetsUp(std::chrono::milliseconds limit) const;

 private:
  bool Launch();

  const PrometheusServerOptions options_;
  TempDir dir_;
  std::string config_;
  int port_ = 0;
  std::unique_ptr<Subprocess> process_;
};

}  // namespace gradhub::testing
