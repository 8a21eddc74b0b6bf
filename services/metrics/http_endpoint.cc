#include "services/metrics/http_endpoint.h"

#include <google/protobuf/util/json_util.h>
#include <httplib.h>

#include "absl/strings/str_cat.h"
#include "services/common/http_errors.h"

namespace gradhub::metrics {
namespace {

void SendJson(httplib::Response& response, int status, const std::string& json) {
  response.status = status;
  response.set_content(json + "\n", "application/json");
}

void SendError(httplib::Response& response, const absl::Status& error) {
  SendJson(response, HttpStatusFor(error.code()), HttpErrorJson(error));
}

// The batch of a POST: proto3 JSON, unknown fields refused; INVALID_ARGUMENT saying where not.
absl::StatusOr<v1::TelemetryBatch> BatchOf(const httplib::Request& request) {
  v1::TelemetryBatch batch;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  const auto parsed = google::protobuf::util::JsonStringToMessage(request.body, &batch, options);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("request body: not a TelemetryBatch in JSON: ", parsed.message().ToString()));
  }
  return batch;
}

}  // namespace

HttpEndpoint::HttpEndpoint(HttpEndpointOptions options) : options_(std::move(options)) {
  server_options_.idle_threads = options_.threads;
  server_options_.limits = options_.limits;
  server_options_.max_body_bytes = options_.max_body_bytes;
  server_options_.tls_cert_file = options_.tls_cert_file;
  server_options_.tls_key_file = options_.tls_key_file;
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
  server_->Post("/v1/telemetry",
                [this](const httplib::Request& request, httplib::Response& response) {
                  Report(request, response);
                });
  // httplib's own errors (no route, a body over the limit) in the handlers' shape; the body's
  // code is the HTTP status sent (a 413 says 413).
  server_->set_error_handler([](const httplib::Request&, httplib::Response& response) {
    if (response.body.empty()) {
      SendJson(response, response.status,
               HttpErrorJson(StatusForHttpError(response.status), response.status));
    }
  });
}

void HttpEndpoint::Report(const httplib::Request& request, httplib::Response& response) const {
  const absl::StatusOr<TelemetrySender> sender =
      options_.authorize(request.get_header_value("Authorization"));
  if (!sender.ok()) return SendError(response, sender.status());
  const absl::StatusOr<v1::TelemetryBatch> batch = BatchOf(request);
  if (!batch.ok()) return SendError(response, batch.status());
  const absl::StatusOr<BatchOutcome> outcome = IngestBatch(*options_.metrics, *sender, *batch);
  if (!outcome.ok()) return SendError(response, outcome.status());
  v1::ReportTelemetryResponse answer;
  answer.set_accepted_steps(outcome->accepted);
  std::string json;
  (void)google::protobuf::util::MessageToJsonString(answer, &json, {});
  SendJson(response, 200, json);
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
