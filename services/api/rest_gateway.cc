#include "services/api/rest_gateway.h"

#include <google/protobuf/util/json_util.h>
#include <httplib.h>

#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <type_traits>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "services/common/http_errors.h"

namespace gradhub::api {
namespace {

using google::protobuf::Message;

// A watcher that sees no change for this long gets a blank line, so a client that went away
// is noticed (the write fails) and its thread freed. NDJSON readers such as jq skip it.
constexpr absl::Duration kStreamKeepAlive = absl::Seconds(15);

// What the metrics record of the request this thread serves. httplib serves a request from
// routing to its last byte on one thread and calls the logger after the last byte (streams
// included), so thread-local state carries it from the route to the logger.
struct RequestRecord {
  absl::Time start = absl::Now();
  const char* method = "unrouted";
  absl::StatusCode code = absl::StatusCode::kOk;
};
thread_local RequestRecord current_request;

void SendError(httplib::Response& response, const absl::Status& status) {
  current_request.code = status.code();
  response.status = HttpStatusFor(status.code());
  response.set_content(HttpErrorJson(status) + "\n", "application/json");
}

std::string ToJson(const Message& message) {
  std::string json;
  (void)google::protobuf::util::MessageToJsonString(message, &json, {});
  return json;
}

template <typename T>
void Send(httplib::Response& response, const absl::StatusOr<T>& result) {
  if (!result.ok()) return SendError(response, result.status());
  if constexpr (std::is_same_v<T, v1::Job>) {
    response.set_header("ETag", absl::StrCat("\"", result->etag(), "\""));
  }
  response.status = 200;
  response.set_content(ToJson(*result) + "\n", "application/json");
}

// An empty body is the empty message; otherwise proto3 JSON, unknown fields refused.
absl::Status ParseBody(const httplib::Request& request, Message* message) {
  if (request.body.empty()) return absl::OkStatus();
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  const auto status = google::protobuf::util::JsonStringToMessage(request.body, message, options);
  if (!status.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("request body: ", status.message().ToString()));
  }
  return absl::OkStatus();
}

// An integer query parameter, left unchanged when absent; INVALID_ARGUMENT naming it.
template <typename Int>
absl::Status IntParam(const httplib::Request& request, const char* name, Int* value) {
  if (!request.has_param(name)) return absl::OkStatus();
  if (!absl::SimpleAtoi(request.get_param_value(name), value)) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": not an integer"));
  }
  return absl::OkStatus();
}

absl::Status BoolParam(const httplib::Request& request, const char* name, bool* value) {
  if (!request.has_param(name)) return absl::OkStatus();
  const std::string text = request.get_param_value(name);
  if (text == "true" || text == "1") {
    *value = true;
  } else if (text == "false" || text == "0") {
    *value = false;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(name, ": expected true or false"));
  }
  return absl::OkStatus();
}

// pageSize, pageToken and filter into any List*Request; INVALID_ARGUMENT naming a bad one.
template <typename ListRequest>
absl::Status ParseListParams(const httplib::Request& request, ListRequest* list) {
  int32_t page_size = 0;
  if (absl::Status parsed = IntParam(request, "pageSize", &page_size); !parsed.ok()) return parsed;
  list->set_page_size(page_size);
  list->set_page_token(request.get_param_value("pageToken"));
  list->set_filter(request.get_param_value("filter"));
  return absl::OkStatus();
}

std::string JobName(const httplib::Request& request) { return "jobs/" + request.matches[1].str(); }

// A JobManager stream (WatchJob, StreamLogs) taking `send(message)` and `stop()`.
using Stream = std::function<absl::Status(const std::function<bool(const Message&)>& send,
                                          const std::function<bool()>& stop)>;

// Whose jobs the caller may act on; on failure the error response is written.
std::optional<int64_t> CallerTenant(const Authenticator& auth, const httplib::Request& request,
                                    httplib::Response& response, JobAccess access) {
  absl::StatusOr<int64_t> id = auth.JobTenant(request.get_header_value("Authorization"), access);
  if (!id.ok()) {
    SendError(response, id.status());
    return std::nullopt;
  }
  return *id;
}

// Labels the request with its rpc's name for the metrics, then handles it.
httplib::Server::Handler Rpc(const char* method, httplib::Server::Handler handler) {
  return [method, handler = std::move(handler)](const httplib::Request& request,
                                                httplib::Response& response) {
    current_request.method = method;
    handler(request, response);
  };
}

// A POST route that reads its own body: a request with neither Content-Length nor
// Transfer-Encoding has no body (RFC 9112 section 6.3; `curl -X POST URL` sends such), but
// httplib 0.11 waits for one until its read timeout and then answers 400. Reading through
// the ContentReader only when a length or chunking is announced treats it as empty, i.e. {}.
void Post(httplib::Server& server, const std::string& pattern, httplib::Server::Handler handler) {
  server.Post(pattern, [handler = std::move(handler)](const httplib::Request& request,
                                                      httplib::Response& response,
                                                      const httplib::ContentReader& content) {
    if (request.has_header("Content-Length") || request.has_header("Transfer-Encoding")) {
      std::string body;
      const bool read = content([&](const char* data, size_t size) {
        body.append(data, size);
        return true;
      });
      if (!read) return;  // httplib set 400 or 413; the error handler writes the body
      // httplib itself fills the body of the (non-const) request it owns the same way.
      const_cast<httplib::Request&>(request).body = std::move(body);
    }
    handler(request, response);
  });
}

// Answers 200 with newline-delimited JSON, one message per line, written by `stream` on this
// thread. The status line is gone by the first line, so a later error is sent as a last line
// of the same {"error": ...} shape. The stream stops when `stopping` (the gateway's Stop) is
// set, or when a keep-alive blank line cannot be written (the client went away).
void StreamLines(httplib::Response& response, const std::atomic<bool>& stopping, Stream stream) {
  response.set_chunked_content_provider(
      "application/x-ndjson", [&stopping, stream](size_t, httplib::DataSink& sink) {
        absl::Time last_write = absl::Now();
        auto write = [&](const std::string& text) {
          if (!sink.write(text.data(), text.size())) return false;
          last_write = absl::Now();
          return true;
        };
        auto send = [&](const Message& message) { return write(ToJson(message) + "\n"); };
        auto stop = [&] {
          if (stopping) return true;
          return absl::Now() - last_write > kStreamKeepAlive && !write("\n");
        };
        const absl::Status status = stream(send, stop);
        if (!status.ok() && !absl::IsCancelled(status)) write(HttpErrorJson(status) + "\n");
        current_request.code = status.code();
        sink.done();
        return true;
      });
}

// GetJobLogs' query: attempt, rank, afterSeq, follow; INVALID_ARGUMENT naming a bad one.
absl::StatusOr<v1::GetJobLogsRequest> ParseLogsRequest(const httplib::Request& request) {
  v1::GetJobLogsRequest logs;
  logs.set_name(JobName(request));
  int32_t attempt = 0, rank = -1;
  int64_t after_seq = 0;
  bool follow = false;
  for (absl::Status parsed :
       {IntParam(request, "attempt", &attempt), IntParam(request, "rank", &rank),
        IntParam(request, "afterSeq", &after_seq), BoolParam(request, "follow", &follow)}) {
    if (!parsed.ok()) return parsed;
  }
  logs.set_attempt(attempt);
  if (request.has_param("rank")) logs.set_rank(rank);
  logs.set_after_seq(after_seq);
  logs.set_follow(follow);
  return logs;
}

}  // namespace

RestGateway::RestGateway(JobManager* jobs, const Authenticator* auth, ApiMetrics* metrics,
                         RestGatewayOptions options)
    : jobs_(jobs), auth_(auth), metrics_(metrics), options_(std::move(options)) {
  server_ = MakeHttpServer(options_);
  Route();
}

RestGateway::~RestGateway() { Stop(); }

absl::StatusOr<int> RestGateway::Start(const std::string& host, int port) {
  return StartHttpServer(*server_, options_, host, port, &thread_);
}

void RestGateway::Stop() {
  if (!thread_.joinable()) return;
  stopping_ = true;
  server_->stop();
  thread_.join();
}

void RestGateway::Route() {
  InstallHooks();
  RouteProbes();
  RouteJobs();
  RouteJobStreams();
}

void RestGateway::InstallHooks() {
  server_->set_pre_routing_handler([](const httplib::Request&, httplib::Response&) {
    current_request = RequestRecord{};
    return httplib::Server::HandlerResponse::Unhandled;
  });
  server_->set_logger([this](const httplib::Request&, const httplib::Response&) {
    metrics_->RecordRequest("rest", current_request.method, current_request.code,
                            absl::Now() - current_request.start);
  });
  // httplib's own errors get the same shape (and metrics code) as the handlers' errors. Runs
  // for every status >= 400; a handler's error already has its body.
  server_->set_error_handler([](const httplib::Request&, httplib::Response& response) {
    if (!response.body.empty()) return;
    // The body's code is the HTTP status sent: 413 stays 413 although its gRPC meaning,
    // RESOURCE_EXHAUSTED, maps to 429 where a handler returns it.
    const int status = response.status;
    const absl::Status error = StatusForHttpError(status);
    current_request.code = error.code();
    response.set_content(HttpErrorJson(error, status) + "\n", "application/json");
  });
}

void RestGateway::RouteProbes() {
  // Liveness needs nothing but this process; readiness needs the database and its schema.
  server_->Get("/healthz", [](const httplib::Request&, httplib::Response& response) {
    response.set_content("ok\n", "text/plain");
  });
  server_->Get("/readyz", [this](const httplib::Request&, httplib::Response& response) {
    const absl::Status ready = jobs_->CheckReady();
    if (!ready.ok()) return SendError(response, ready);
    response.set_content("ok\n", "text/plain");
  });
  server_->Get("/metrics", [this](const httplib::Request&, httplib::Response& response) {
    response.set_content(metrics_->Scrape(), "text/plain; version=0.0.4");
  });
}

void RestGateway::RouteJobs() {
  const Authenticator& auth = *auth_;
  Post(*server_, "/v1/jobs",
       Rpc("JobService.CreateJob",
           [this, &auth](const httplib::Request& request, httplib::Response& response) {
             auto id = CallerTenant(auth, request, response, JobAccess::kCreate);
             if (!id) return;
             v1::JobSpec spec;
             if (auto parsed = ParseBody(request, &spec); !parsed.ok())
               return SendError(response, parsed);
             Send(response, jobs_->CreateJob(*id, spec, request.get_param_value("requestId")));
           }));
  server_->Get("/v1/jobs", Rpc("JobService.ListJobs", [this, &auth](const httplib::Request& request,
                                                                    httplib::Response& response) {
                 auto id = CallerTenant(auth, request, response, JobAccess::kReadOrCancel);
                 if (!id) return;
                 v1::ListJobsRequest list;
                 if (auto parsed = ParseListParams(request, &list); !parsed.ok())
                   return SendError(response, parsed);
                 Send(response, jobs_->ListJobs(*id, list));
               }));
  server_->Get(R"(/v1/jobs/([^/:]+))",
               Rpc("JobService.GetJob",
                   [this, &auth](const httplib::Request& request, httplib::Response& response) {
                     auto id = CallerTenant(auth, request, response, JobAccess::kReadOrCancel);
                     if (!id) return;
                     Send(response, jobs_->GetJob(*id, JobName(request)));
                   }));
  Post(*server_, R"(/v1/jobs/([^/:]+):cancel)",
       Rpc("JobService.CancelJob",
           [this, &auth](const httplib::Request& request, httplib::Response& response) {
             auto id = CallerTenant(auth, request, response, JobAccess::kReadOrCancel);
             if (!id) return;
             v1::CancelJobRequest cancel;
             if (auto parsed = ParseBody(request, &cancel); !parsed.ok())
               return SendError(response, parsed);
             Send(response, jobs_->CancelJob(*id, JobName(request), cancel.reason()));
           }));
  server_->Get(R"(/v1/jobs/([^/:]+)/events)",
               Rpc("JobService.ListJobEvents",
                   [this, &auth](const httplib::Request& request, httplib::Response& response) {
                     auto id = CallerTenant(auth, request, response, JobAccess::kReadOrCancel);
                     if (!id) return;
                     v1::ListJobEventsRequest list;
                     list.set_parent(JobName(request));
                     if (auto parsed = ParseListParams(request, &list); !parsed.ok())
                       return SendError(response, parsed);
                     Send(response, jobs_->ListJobEvents(*id, list));
                   }));
  server_->Get(R"(/v1/jobs/([^/:]+)/metrics)",
               Rpc("JobService.GetJobMetrics",
                   [this, &auth](const httplib::Request& request, httplib::Response& response) {
                     auto id = CallerTenant(auth, request, response, JobAccess::kReadOrCancel);
                     if (!id) return;
                     v1::GetJobMetricsRequest metrics;
                     metrics.set_name(JobName(request));
                     int32_t max_points = 0;
                     if (auto parsed = IntParam(request, "maxPoints", &max_points); !parsed.ok()) {
                       return SendError(response, parsed);
                     }
                     metrics.set_max_points(max_points);
                     Send(response, jobs_->GetJobMetrics(*id, metrics));
                   }));
}

void RestGateway::RouteJobStreams() {
  const Authenticator& auth = *auth_;
  server_->Get(R"(/v1/jobs/([^/:]+):watch)",
               Rpc("JobService.WatchJob",
                   [this, &auth](const httplib::Request& request, httplib::Response& response) {
                     auto id = CallerTenant(auth, request, response, JobAccess::kReadOrCancel);
                     if (!id) return;
                     // A missing job is a 404, not a stream that ends at once.
                     if (auto job = jobs_->GetJob(*id, JobName(request)); !job.ok()) {
                       return SendError(response, job.status());
                     }
                     StreamLines(response, stopping_,
                                 [this, tenant_id = *id, name = JobName(request)](
                                     const auto& send, const auto& stop) {
                                   return jobs_->WatchJob(tenant_id, name, send, stop);
                                 });
                   }));
  server_->Get(R"(/v1/jobs/([^/:]+)/logs)",
               Rpc("JobService.GetJobLogs",
                   [this, &auth](const httplib::Request& request, httplib::Response& response) {
                     auto id = CallerTenant(auth, request, response, JobAccess::kReadOrCancel);
                     if (!id) return;
                     absl::StatusOr<v1::GetJobLogsRequest> logs = ParseLogsRequest(request);
                     if (!logs.ok()) return SendError(response, logs.status());
                     if (auto job = jobs_->GetJob(*id, logs->name()); !job.ok()) {
                       return SendError(response, job.status());
                     }
                     StreamLines(
                         response, stopping_,
                         [this, tenant_id = *id, logs = *logs](const auto& send, const auto& stop) {
                           return jobs_->StreamLogs(tenant_id, logs, send, stop);
                         });
                   }));
}

}  // namespace gradhub::api
