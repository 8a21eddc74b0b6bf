// The metrics service's HTTP face (cpp-httplib): /metrics for Prometheus, /healthz (the process
// answers), /readyz (it can read the database, so it can admit jobs), and POST /v1/telemetry,
// telemetry for clients that cannot speak gRPC (the gradhub Python module of script ranks):
// a TelemetryBatch in the proto3 JSON mapping with `Authorization: Bearer <token>`, answered
// with a ReportTelemetryResponse or an error as every gradhub REST server answers one
// (services/common/http_errors.h). HTTPS only when a certificate is given: tokens cross it.
//
// Thread-safe: Start and Stop from one thread; the handlers run on the server's own threads.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "services/common/http_server.h"
#include "services/metrics/telemetry_intake.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace gradhub::metrics {

struct HttpEndpointOptions {
  // The body of /metrics (Prometheus text format 0.0.4).
  std::function<std::string()> scrape;
  // OK when ready; else /readyz answers 503 with the message.
  std::function<absl::Status()> ready;
  // POST /v1/telemetry: who may send what (telemetry_intake.h, checked before the body is
  // parsed), and where batches go (not owned; outlives the endpoint).
  AuthorizeTelemetry authorize;
  TrainingMetrics* metrics = nullptr;
  // Both set = HTTPS only (PEM files), as the gRPC port.
  std::string tls_cert_file;
  std::string tls_key_file;
  // Threads kept for the next connections (a scrape or a batch is short; a few suffice).
  int threads = 4;
  // Larger bodies are refused with 413 unread: a batch of a few steps is a few KiB.
  size_t max_body_bytes = 1 << 20;
  // Connections and request times (edge_limits.h; the server's --http-* flags).
  HttpLimits limits;
};

class HttpEndpoint {
 public:
  explicit HttpEndpoint(HttpEndpointOptions options);
  ~HttpEndpoint();  // Stop()

  // Binds host:port (0 = a free port) and serves on a background thread. Returns the port.
  absl::StatusOr<int> Start(const std::string& host, int port);
  // Stops accepting, lets in-flight requests finish, joins the thread. Idempotent.
  void Stop();

 private:
  // POST /v1/telemetry: rules 1 to 4 of telemetry_intake.h, the answer or the error.
  void Report(const httplib::Request& request, httplib::Response& response) const;

  HttpEndpointOptions options_;
  HttpServerOptions server_options_;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
};

}  // namespace gradhub::metrics
