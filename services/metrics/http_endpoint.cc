#include "services/metrics/http_endpoint.h"

#include <httplib.h>

#include "absl/strings/str_cat.h"

namespace gradhub::metrics {

HttpEndpoint::HttpEndpoint(HttpEndpointOptions options)
    : options_(std::move(options)), server_(std::make_unique<httplib::Server>()) {
  const int threads = options_.threads;
  server_->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  server_->Get("/healthz", [](const httplib::Request&, httplib::Response& response) {
    response.set_content("ok\n", "text/plain");
  });
  server_->Get("/readyz", [this](const httplib::Request&, httplib::Response& response) {
    const absl::Status ready = options_.ready();
    response.status = ready.ok() ? 200 : 503;
    response.set_content(ready.ok() ? "ok\n" : absl::StrCat(ready.message(), "\n"), "text/plain");
  });
  server_->Get("/metrics", [this](const httplib::Request&, httplib::Response& response) {
    response.set_content(options_.scrape(), "text/plain; version=0.0.4");
  });
}

HttpEndpoint::~HttpEndpoint() { Stop(); }

absl::StatusOr<int> HttpEndpoint::Start(const std::string& host, int port) {
  const int bound = port == 0 ? server_->bind_to_any_port(host.c_str())
                              : (server_->bind_to_port(host.c_str(), port) ? port : -1);
  if (bound < 0) return absl::UnavailableError(absl::StrCat("cannot listen on ", host, ":", port));
  thread_ = std::thread([this] { server_->listen_after_bind(); });
  return bound;
}

void HttpEndpoint::Stop() {
  if (!thread_.joinable()) return;
  server_->stop();
  thread_.join();
}

}  // namespace gradhub::metrics
