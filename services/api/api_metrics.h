// What gradhub-api exposes at /metrics (Prometheus text format): requests by transport, method
// and status code, their latency, the scheduling latency, and the state of the cluster.
// Counters and histograms of what this process did live in a prometheus-cpp registry fed by
// the gRPC interceptor, the REST gateway and the scheduler. The cluster's state is read from
// PostgreSQL at scrape time, so every replica of the api reports the same truth, and a restart
// of the api loses nothing:
//   gradhub_jobs{state}                      jobs in each state
//   gradhub_job_restarts_total{reason}       restarts spent, reason = infrastructure | job (the
//                                            budget of JobSpec.max_restarts each one used)
//   gradhub_nodes{state}                     nodes in each state (READY, CORDONED, ...)
//   gradhub_slots{state}                     slots: used (a live rank holds it), free (on READY
//                                            nodes), unavailable (idle on CORDONED or DRAINING
//                                            nodes); LOST nodes' slots are not counted
//   gradhub_api_database_up                  1 when the scrape could read all of the above
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "services/common/db/pool.h"

namespace prometheus {
class Registry;
template <typename T>
class Family;
class Counter;
class Gauge;
class Histogram;
}  // namespace prometheus

namespace gradhub::api {

// Thread-safe: RecordRequest and ObserveSchedulingLatency are called from every request thread
// and the scheduler at once (prometheus-cpp's counters and histograms are atomic); Scrape may
// run concurrently with them and with itself (each scrape uses its own pooled connection).
class ApiMetrics {
 public:
  // `pool` (not owned) is read at each scrape for jobs by state.
  explicit ApiMetrics(db::Pool* pool);
  ~ApiMetrics();

  // One finished request. `transport` is "grpc" or "rest"; `method` the rpc's name
  // as "JobService.CreateJob" whatever the transport, never a path, so label values stay few.
  void RecordRequest(std::string_view transport, std::string_view method, absl::StatusCode code,
                     absl::Duration latency);

  // An attempt of a job had all its ranks running `latency` after the job entered the queue
  // (submitted, or restarting): gradhub_scheduling_latency_seconds.
  void ObserveSchedulingLatency(absl::Duration latency);

  // Whether this replica leads the control plane now, and in which term (leader_lease.h):
  // gradhub_api_leader (1 or 0) and gradhub_api_leader_terms_total (terms this replica began).
  void SetLeading(bool leading);

  // The text exposition format, version 0.0.4.
  std::string Scrape() const;

  // Where other parts of the server register what they count (the audit recorder's
  // gradhub_audit_write_failures_total); Scrape shows it.
  prometheus::Registry& registry() { return *registry_; }

 private:
  db::Pool* pool_;
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>* requests_;
  prometheus::Family<prometheus::Histogram>* latency_;
  prometheus::Histogram* scheduling_latency_;
  prometheus::Gauge* leading_;
  prometheus::Counter* terms_;
};

}  // namespace gradhub::api
