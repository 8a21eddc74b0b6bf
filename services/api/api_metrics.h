// What gradhub-api exposes at /metrics (Prometheus text format): requests by transport, method
// and status code, their latency, and jobs by state. Counters and histograms live in a
// prometheus-cpp registry fed by the gRPC interceptor and the REST gateway; jobs by state are
// counted in PostgreSQL at scrape time, so every replica of the api reports the same truth.
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
class Histogram;
}  // namespace prometheus

namespace gradhub::api {

class ApiMetrics {
 public:
  // `pool` (not owned) is read at each scrape for jobs by state.
  explicit ApiMetrics(db::Pool* pool);
  ~ApiMetrics();

  // One finished request. `transport` is "grpc" or "rest"; `method` the rpc's name
  // as "JobService.CreateJob" whatever the transport, never a path, so label values stay few.
  void RecordRequest(std::string_view transport, std::string_view method, absl::StatusCode code,
                     absl::Duration latency);

  // The text exposition format, version 0.0.4.
  std::string Scrape() const;

 private:
  db::Pool* pool_;
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>* requests_;
  prometheus::Family<prometheus::Histogram>* latency_;
};

}  // namespace gradhub::api
