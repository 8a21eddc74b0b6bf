// The metrics service's HTTP face (cpp-httplib): /metrics for Prometheus, /healthz (the process
// answers) and /readyz (it can read the database, so it can admit jobs). Plain HTTP: the
// exposition holds no secrets and Prometheus scrapes it from inside the cluster; TLS guards
// the gRPC port, where trainers send their tokens.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "services/common/http_server.h"

namespace httplib {
class Server;
}

namespace gradhub::metrics {

struct HttpEndpointOptions {
  // The body of /metrics (Prometheus text format 0.0.4).
  std::function<std::string()> scrape;
  // OK when ready; else /readyz answers 503 with the message.
  std::function<absl::Status()> ready;
  // Requests served at once (a scrape is short; a few suffice).
  int threads = 4;
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
  HttpEndpointOptions options_;
  HttpServerOptions server_options_;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
};

}  // namespace gradhub::metrics
