#include "services/api/api_metrics.h"

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <map>
#include <optional>

#include "absl/strings/str_cat.h"
#include "gradhub/v1/jobs.pb.h"
#include "gradhub/v1/nodes.pb.h"
#include "services/common/contract/job_states.h"

namespace gradhub::api {
namespace {

// From 0.5 ms (a cached read) to 10 s (a stuck database), about two buckets per decade.
const prometheus::Histogram::BucketBoundaries kLatencyBuckets = {
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};

// From a tenth of a second (an idle cluster) to two hours (a large job waiting for slots).
const prometheus::Histogram::BucketBoundaries kSchedulingBuckets = {
    0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200};

prometheus::MetricFamily Gauges(const char* name, const char* help, const char* label,
                                const std::map<std::string, double>& values,
                                prometheus::MetricType type = prometheus::MetricType::Gauge) {
  prometheus::MetricFamily family{name, help, type, {}};
  for (const auto& [label_value, value] : values) {
    prometheus::ClientMetric metric;
    metric.label.push_back({label, label_value});
    (type == prometheus::MetricType::Counter ? metric.counter.value : metric.gauge.value) = value;
    family.metric.push_back(std::move(metric));
  }
  return family;
}

// Every value of a proto enum but the unspecified one, at 0, so a dashboard's series never
// disappear.
std::map<std::string, double> ZeroByName(const google::protobuf::EnumDescriptor* states) {
  std::map<std::string, double> zeros;
  for (int i = 0; i < states->value_count(); ++i) {
    if (states->value(i)->number() != 0) zeros[states->value(i)->name()] = 0;
  }
  return zeros;
}

// Jobs by state and restarts by the budget they spent, from one scan of `jobs`. Nothing when
// the database cannot be read: zero jobs would be a lie.
std::optional<std::vector<prometheus::MetricFamily>> ReadJobs(db::Pool& pool) {
  auto rows = pool.Exec(
      "SELECT state, count(*)::bigint AS n, sum(infra_restarts)::bigint AS infrastructure,"
      " sum(job_restarts)::bigint AS job FROM jobs GROUP BY state");
  if (!rows.ok()) return std::nullopt;
  std::map<std::string, double> jobs = ZeroByName(v1::Job::State_descriptor());
  std::map<std::string, double> restarts = {{"infrastructure", 0}, {"job", 0}};
  for (const db::Row& row : *rows) {
    jobs[row.Get<std::string>("state")] = static_cast<double>(row.Get<int64_t>("n"));
    restarts["infrastructure"] += static_cast<double>(row.Get<int64_t>("infrastructure"));
    restarts["job"] += static_cast<double>(row.Get<int64_t>("job"));
  }
  std::vector<prometheus::MetricFamily> families;
  families.push_back(
      Gauges("gradhub_jobs", "Jobs in each state, from the database.", "state", jobs));
  families.push_back(Gauges("gradhub_job_restarts_total",
                            "Restarts of jobs, by the restart budget they spent (infrastructure "
                            "or job failures), from the database.",
                            "reason", restarts, prometheus::MetricType::Counter));
  return families;
}

// Nodes by state and their slots by use, from one scan of `nodes` and of the live ranks.
std::optional<std::vector<prometheus::MetricFamily>> ReadNodes(db::Pool& pool) {
  auto rows = pool.Exec(absl::StrCat(
      "SELECT n.state, count(*)::bigint AS nodes, coalesce(sum(n.slots), 0)::bigint AS slots,"
      " coalesce(sum(least(u.used, n.slots)), 0)::bigint AS used"
      " FROM nodes n LEFT JOIN (SELECT node_id, count(*) AS used FROM rank_assignments"
      "   WHERE state IN ",
      kLiveRankStatesSql,
      " GROUP BY node_id) u ON u.node_id = n.id"
      " GROUP BY n.state"));
  if (!rows.ok()) return std::nullopt;
  std::map<std::string, double> nodes = ZeroByName(v1::Node::State_descriptor());
  std::map<std::string, double> slots = {{"used", 0}, {"free", 0}, {"unavailable", 0}};
  for (const db::Row& row : *rows) {
    const std::string state = row.Get<std::string>("state");
    nodes[state] = static_cast<double>(row.Get<int64_t>("nodes"));
    if (state == "LOST") continue;
    const auto used = static_cast<double>(row.Get<int64_t>("used"));
    slots["used"] += used;
    slots[state == "READY" ? "free" : "unavailable"] +=
        static_cast<double>(row.Get<int64_t>("slots")) - used;
  }
  std::vector<prometheus::MetricFamily> families;
  families.push_back(
      Gauges("gradhub_nodes", "Nodes in each state, from the database.", "state", nodes));
  families.push_back(Gauges("gradhub_slots",
                            "Slots of nodes that are not LOST: used by a live rank, free on READY "
                            "nodes, unavailable (idle) on CORDONED or DRAINING ones.",
                            "state", slots));
  return families;
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
                    .Register(*registry_)),
      scheduling_latency_(
          &prometheus::BuildHistogram()
               .Name("gradhub_scheduling_latency_seconds")
               .Help("Time from a job entering the queue (submitted, or restarting) to all ranks "
                     "of its attempt running; observed by the replica whose scheduler saw it.")
               .Register(*registry_)
               .Add({}, kSchedulingBuckets)),
      leading_(&prometheus::BuildGauge()
                    .Name("gradhub_api_leader")
                    .Help("1 while this replica leads the control plane (runs the scheduler), "
                          "else 0.")
                    .Register(*registry_)
                    .Add({})),
      terms_(&prometheus::BuildCounter()
                  .Name("gradhub_api_leader_terms_total")
                  .Help("Leader terms this replica began (takeovers, and new terms after a "
                        "pause or a database outage).")
                  .Register(*registry_)
                  .Add({})) {}

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

void ApiMetrics::SetLeading(bool leading) {
  leading_->Set(leading ? 1 : 0);
  if (leading) terms_->Increment();
}

void ApiMetrics::ObserveSchedulingLatency(absl::Duration latency) {
  scheduling_latency_->Observe(absl::ToDoubleSeconds(latency));
}

std::string ApiMetrics::Scrape() const {
  std::vector<prometheus::MetricFamily> families = registry_->Collect();
  bool database_ok = true;
  for (auto read : {&ReadJobs, &ReadNodes}) {
    std::optional<std::vector<prometheus::MetricFamily>> read_families = read(*pool_);
    database_ok &= read_families.has_value();
    if (!read_families) continue;
    for (auto& family : *read_families) families.push_back(std::move(family));
  }
  prometheus::MetricFamily up{"gradhub_api_database_up",
                              "1 when the scrape could read the database.",
                              prometheus::MetricType::Gauge,
                              {}};
  up.metric.emplace_back().gauge.value = database_ok ? 1 : 0;
  families.push_back(std::move(up));
  return prometheus::TextSerializer().Serialize(families);
}

}  // namespace gradhub::api
