// The REST+JSON face of JobService (cpp-httplib): the same operations and messages in the
// proto3 JSON mapping, at the paths jobs.proto gives next to each rpc. It calls JobManager
// and Authenticator directly, as the gRPC adapter does; no logic of its own but transport:
// status codes, body limits, JSON parsing, newline-delimited JSON for streams. Also serves
// /healthz, /readyz and /metrics.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "services/api/api_metrics.h"
#include "services/api/job_manager.h"
#include "services/common/auth/authenticator.h"
#include "services/common/http_server.h"

namespace httplib {
class Server;
}

namespace gradhub::api {

// A watch or a followed log holds one of max_concurrent_requests for its whole life.
using RestGatewayOptions = HttpServerOptions;

// Thread-safety: Start and Stop are called by the thread that owns the gateway (Stop also from
// the destructor), never concurrently. Requests are served on cpp-httplib's worker threads,
// which call only thread-safe JobManager, Authenticator and ApiMetrics methods.
class RestGateway {
 public:
  // Not owned; all must outlive the gateway.
  RestGateway(JobManager* jobs, const Authenticator* auth, ApiMetrics* metrics,
              RestGatewayOptions options = {});
  ~RestGateway();  // Stop()

  // Binds host:port (0 = a free port) and serves on a background thread. Returns the port.
  absl::StatusOr<int> Start(const std::string& host, int port);
  // Stops accepting, ends streams, lets in-flight requests finish, joins the thread.
  // Idempotent.
  void Stop();

 private:
  // Every route and hook, once, from the constructor.
  void Route();
  void InstallHooks();     // request records for the metrics; httplib's own errors as ours
  void RouteProbes();      // /healthz, /readyz, /metrics
  void RouteJobs();        // the unary JobService calls
  void RouteJobStreams();  // WatchJob and GetJobLogs as newline-delimited JSON

  JobManager* jobs_;
  const Authenticator* auth_;
  ApiMetrics* metrics_;
  RestGatewayOptions options_;
  std::unique_ptr<httplib::Server> server_;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

}  // namespace gradhub::api
