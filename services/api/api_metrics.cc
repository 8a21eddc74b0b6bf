#include "services/api/api_metrics.h"

#include <prometheus/counter.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <map>
#include <optional>

#include "gradhub/v1/jobs.pb.h"

namespace gradhub::api {
namespace {

// From 0.5 ms (a cached read) to 10 s (a stuck database), about two buckets per decade.
const prometheus::Histogram::BucketBoundaries kLatencyBuckets = {
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};

// Every state, with 0 for those no job is in, so a dashboard's series never disappear. Nothing
// when the database cannot be read: zero jobs would be a lie.
std::optional<prometheus::MetricFamily> CountJobsByState(db::Pool& pool) {
  prometheus::MetricFamily family{"gradhub_jobs", "Jobs in each state, from the database.",
                                  prometheus::MetricType::Gauge, {}};
  std::map<std::string, double> counts;
  for (int state = v1::Job::State_MIN; state <= v1::Job::State_MAX; ++state) {
    if (state != v1::Job::STATE_UNSPECIFIED && v1::Job::State_IsValid(state)) {
      counts[v1::Job::State_Name(static_cast<v1::Job::State>(state))] = 0;
    }
  }
  auto rows = pool.Exec("SELECT state, count(*)::bigint AS n FROM jobs GROUP BY state");
  if (!rows.ok()) return std::nullopt;
  for (const db::Row& row : *rows) {
    counts[row.Get<std::string>("state")] = static_cast<double>(row.Get<int64_t>("n"));
  }
  for (const auto& [state, count] : counts) {
    prometheus::ClientMetric metric;
    metric.label.push_back({"state", state});
    metric.gauge.value = count;
    family.metric.push_back(std::move(metric));
  }
  return family;
}

}  // namespace

ApiMetrics::ApiMetrics(db::Pool* pool)
    : pool_(pool),
      registry_(std::make_shared<prometheus::Registry>()),
      requests_(&prometheus::BuildCounter()
                     .Name("gradhub_api_requests_total")
                     .Help("Requests answered, by transport, method and status code.")
                     .Register(*registry_)),
      latency_(&prometheus::BuildHistogram()
                    .Name("gradhub_api_request_duration_seconds")
                    .Help("Time from a request's arrival to its complete answer (for a stream, its "
                          "whole life).")
                    .Register(*registry_)) {}

ApiMetrics::~ApiMetrics() = default;

void ApiMetrics::RecordRequest(std::string_view transport, std::string_view method,
                               absl::StatusCode code, absl::Duration latency) {
  const std::string transport_label(transport), method_label(method);
  requests_
      ->Add({{"transport", transport_label},
             {"method", method_label},
             {"code", absl::StatusCodeToString(code)}})
      .Increment();
  latency_->Add({{"transport", transport_label}, {"method", method_label}}, kLatencyBuckets)
      .Observe(absl::ToDoubleSeconds(latency));
}

std::string ApiMetrics::Scrape() const {
  std::vector<prometheus::MetricFamily> families = registry_->Collect();
  std::optional<prometheus::MetricFamily> jobs = CountJobsByState(*pool_);
  const bool database_ok = jobs.has_value();
  if (database_ok) families.push_back(*std::move(jobs));
  prometheus::MetricFamily up{"gradhub_api_database_up",
                              "1 when the scrape could read the database.",
                              prometheus::MetricType::Gauge, {}};
  up.metric.emplace_back().gauge.value = database_ok ? 1 : 0;
  families.push_back(std::move(up));
  return prometheus::TextSerializer().Serialize(families);
}

}  // namespace gradhub::api
