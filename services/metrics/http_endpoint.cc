#include "services/metrics/http_endpoint.h"

#include <httplib.h>

#include "absl/strings/str_cat.h"

namespace gradhub::metrics {

HttpEndpoint::HttpEndpoint(HttpEndpointOptions options) : options_(std::move(options)) {
  server_options_.max_concurrent_requests = options_.threads;
  server_options_.max_body_bytes = 64 << 10;  // no route takes a body
  server_ = MakeHttpServer(server_options_);
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
  return StartHttpServer(*server_, server_options_, host, port, &thread_);
}

void HttpEndpoint::Stop() {
  if (!thread_.joinable()) return;
  server_->stop();
  thread_.join();
}

}  // namespace gradhub::metrics
