#include "services/api/rest_gateway.h"

#include <google/protobuf/util/json_util.h>
#include <httplib.h>

#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "services/api/rest_request.h"
#include "services/common/audit/audited_calls.h"
#include "services/common/audit/http_audit.h"
#include "services/common/http_errors.h"
#include "services/common/status_macros.h"

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
    if (const absl::Status text = CheckRequestText(request); !text.ok()) {
      return SendError(response, text);
    }
    handler(request, response);
  };
}

// A unary JobService route: the caller's tenant as JobTenant finds it for `access`, then
// `call(request, tenant_id)`, which returns the absl::StatusOr<message> to answer with.
template <typename Call>
httplib::Server::Handler JobRpc(const char* method, const Authenticator& auth, JobAccess access,
                                Call call) {
  return Rpc(method, [&auth, access, call = std::move(call)](const httplib::Request& request,
                                                             httplib::Response& response) {
    if (auto id = CallerTenant(auth, request, response, access)) Send(response, call(request, *id));
  });
}

// A unary route for the admin token alone, as its gRPC call is (Authenticator::RequireAdmin),
// then `call(request)`, which returns the absl::StatusOr<message> to answer with.
template <typename Call>
httplib::Server::Handler AdminRpc(const char* method, const Authenticator& auth, Call call) {
  return Rpc(method, [&auth, call = std::move(call)](const httplib::Request& request,
                                                     httplib::Response& response) {
    const absl::Status admin = auth.RequireAdmin(request.get_header_value("Authorization"));
    if (!admin.ok()) return SendError(response, admin);
    Send(response, call(request));
  });
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
// thread, when the caller's tenant may open one more stream (`slots`, per tenant and in all;
// the admin token counts as a tenant of its own); else 429 naming the limit. The status line is
// gone by the first line, so a later error is sent as a last line of the same {"error": ...}
// shape. The stream stops when `stopping` (the gateway's Stop) is set, or when a keep-alive
// blank line cannot be written (the client went away); its slot is freed with the response.
void StreamLines(httplib::Response& response, const std::atomic<bool>& stopping, KeyedSlots& slots,
                 int64_t tenant_id, Stream stream) {
  absl::StatusOr<KeyedSlots::Slot> slot =
      slots.Acquire(tenant_id == kAnyTenant ? "admin" : absl::StrCat(tenant_id));
  if (!slot.ok()) return SendError(response, slot.status());
  auto held = std::make_shared<KeyedSlots::Slot>(*std::move(slot));
  response.set_chunked_content_provider(
      "application/x-ndjson", [&stopping, stream, held](size_t, httplib::DataSink& sink) {
        absl::Time last_write = absl::Now();
        auto write = [&](const std::string& text) {
          if (!sink.write(text.data(), text.size())) return false;
          last_write = absl::Now();
          return true;
        };
        auto send = [&](const Message& message) { return write(ToJson(message) + "\n"); };
        // A client that closed its end is seen at once (its slot is freed); one that vanished
        // without a word, at the keep-alive line.
        auto stop = [&] {
          if (stopping || !sink.is_writable()) return true;
          return absl::Now() - last_write > kStreamKeepAlive && !write("\n");
        };
        const absl::Status status = stream(send, stop);
        if (!status.ok() && !absl::IsCancelled(status)) write(HttpErrorJson(status) + "\n");
        current_request.code = status.code();
        sink.done();
        return true;
      });
}

}  // namespace

RestGateway::RestGateway(RestBackends backends, RestGatewayOptions options)
    : backends_(std::move(backends)),
      options_(std::move(options)),
      streams_({.max_total = options_.streams.max_streams,
                .max_per_key = options_.streams.max_streams_per_tenant},
               {.what = "watch and log streams",
                .key_noun = "tenant",
                .total_flag = "--http-max-streams",
                .per_key_flag = "--http-max-streams-per-tenant"}) {
  // Every route that takes a body needs a token: a caller without a valid one is answered 401
  // from the headers, before a byte of its body is read.
  if (!options_.admit_body) {
    options_.admit_body = [auth = backends_.auth](const httplib::Request& request) {
      return auth->Authenticate(request.get_header_value("Authorization")).status();
    };
  }
  server_ = MakeHttpServer(options_);
  Route();
}

RestGateway::~RestGateway() { Stop(); }

absl::StatusOr<int> RestGateway::Start(const std::string& host, int port) {
  GRADHUB_RETURN_IF_ERROR(options_.streams.Validate());
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
  RouteNodes();
  RouteTenants();
  RouteAudit();
}

void RestGateway::InstallHooks() {
  if (backends_.auditor != nullptr) audit::AuditHttpCalls(*server_, backends_.auditor);
  server_->set_pre_routing_handler([](const httplib::Request&, httplib::Response&) {
    current_request = RequestRecord{};
    return httplib::Server::HandlerResponse::Unhandled;
  });
  server_->set_logger([this](const httplib::Request&, const httplib::Response&) {
    backends_.metrics->RecordRequest("rest", current_request.method, current_request.code,
                                     absl::Now() - current_request.start);
    // A request refused from its headers (http_server.h) never reaches the pre-routing hook.
    current_request = RequestRecord{};
  });
  // httplib's own errors get the same shape (and metrics code) as the handlers' errors. Runs
  // for every status >= 400; a handler's error already has its body and its code, a refusal
  // from the headers its body only.
  server_->set_error_handler([](const httplib::Request&, httplib::Response& response) {
    // The body's code is the HTTP status sent: 413 stays 413 although its gRPC meaning,
    // RESOURCE_EXHAUSTED, maps to 429 where a handler returns it.
    const int status = response.status;
    const absl::Status error = StatusForHttpError(status);
    if (current_request.code == absl::StatusCode::kOk) current_request.code = error.code();
    if (!response.body.empty()) return;
    response.set_content(HttpErrorJson(error, status) + "\n", "application/json");
  });
}

void RestGateway::RouteProbes() {
  // Liveness needs nothing but this process; readiness needs the database and its schema.
  server_->Get("/healthz", [](const httplib::Request&, httplib::Response& response) {
    response.set_content("ok\n", "text/plain");
  });
  server_->Get("/readyz", [this](const httplib::Request&, httplib::Response& response) {
    const absl::Status ready = backends_.jobs->CheckReady();
    if (!ready.ok()) return SendError(response, ready);
    // Every replica that reaches the database serves, leading or not; the leader is named for
    // operators.
    const std::string leadership = backends_.leadership ? backends_.leadership() : "";
    response.set_content(leadership.empty() ? "ok\n" : "ok\n" + leadership + "\n", "text/plain");
  });
  server_->Get("/metrics", [this](const httplib::Request&, httplib::Response& response) {
    response.set_content(backends_.metrics->Scrape(), "text/plain; version=0.0.4");
  });
}

void RestGateway::RouteJobs() {
  const Authenticator& auth = *backends_.auth;
  JobManager* jobs = backends_.jobs;
  using Request = httplib::Request;
  const audit::CallAuditor* auditor = backends_.auditor;
  Post(*server_, rest_paths::kJobs,
       JobRpc("JobService.CreateJob", auth, JobAccess::kCreate,
              [jobs, auditor](const Request& request, int64_t id) -> absl::StatusOr<v1::Job> {
                v1::JobSpec spec;
                GRADHUB_RETURN_IF_ERROR(ParseBody(request, &spec));
                // Written with the job (AuditedRpc::ok_event_written_by_handler).
                std::optional<audit::AuditRecord> event;
                if (auditor != nullptr) {
                  event = auditor->EventOf(audit::RestCallOf(request, audit::kCreateJobMethod));
                }
                return jobs->CreateJob(id, spec, request.get_param_value("requestId"),
                                       std::move(event));
              }));
  server_->Get(
      rest_paths::kJobs,
      JobRpc("JobService.ListJobs", auth, JobAccess::kReadOrCancel,
             [jobs](const Request& request, int64_t id) -> absl::StatusOr<v1::ListJobsResponse> {
               v1::ListJobsRequest list;
               GRADHUB_RETURN_IF_ERROR(ParseListParams(request, &list));
               return jobs->ListJobs(id, list);
             }));
  server_->Get(rest_paths::kJob, JobRpc("JobService.GetJob", auth, JobAccess::kReadOrCancel,
                                        [jobs](const Request& request, int64_t id) {
                                          return jobs->GetJob(id, JobName(request));
                                        }));
  Post(*server_, rest_paths::kJobCancel,
       JobRpc("JobService.CancelJob", auth, JobAccess::kReadOrCancel,
              [jobs](const Request& request, int64_t id) -> absl::StatusOr<v1::Job> {
                v1::CancelJobRequest cancel;
                GRADHUB_RETURN_IF_ERROR(ParseBody(request, &cancel));
                return jobs->CancelJob(id, JobName(request), cancel.reason());
              }));
  RouteJobHistory();
}

void RestGateway::RouteJobHistory() {
  const Authenticator& auth = *backends_.auth;
  JobManager* jobs = backends_.jobs;
  using Request = httplib::Request;
  server_->Get(rest_paths::kJobEvents,
               JobRpc("JobService.ListJobEvents", auth, JobAccess::kReadOrCancel,
                      [jobs](const Request& request,
                             int64_t id) -> absl::StatusOr<v1::ListJobEventsResponse> {
                        v1::ListJobEventsRequest list;
                        list.set_parent(JobName(request));
                        GRADHUB_RETURN_IF_ERROR(ParseListParams(request, &list));
                        return jobs->ListJobEvents(id, list);
                      }));
  server_->Get(rest_paths::kJobMetrics,
               JobRpc("JobService.GetJobMetrics", auth, JobAccess::kReadOrCancel,
                      [jobs](const Request& request, int64_t id) -> absl::StatusOr<v1::JobMetrics> {
                        v1::GetJobMetricsRequest metrics;
                        metrics.set_name(JobName(request));
                        int32_t max_points = 0;
                        GRADHUB_RETURN_IF_ERROR(IntParam(request, "maxPoints", &max_points));
                        metrics.set_max_points(max_points);
                        return jobs->GetJobMetrics(id, metrics);
                      }));
}

void RestGateway::RouteJobStreams() {
  const Authenticator& auth = *backends_.auth;
  JobManager* jobs = backends_.jobs;
  server_->Get(rest_paths::kJobWatch,
               Rpc("JobService.WatchJob", [this, jobs, &auth](const httplib::Request& request,
                                                              httplib::Response& response) {
                 auto id = CallerTenant(auth, request, response, JobAccess::kReadOrCancel);
                 if (!id) return;
                 // A missing job is a 404, not a stream that ends at once.
                 if (auto job = jobs->GetJob(*id, JobName(request)); !job.ok()) {
                   return SendError(response, job.status());
                 }
                 StreamLines(response, stopping_, streams_, *id,
                             [jobs, tenant_id = *id, name = JobName(request)](const auto& send,
                                                                              const auto& stop) {
                               return jobs->WatchJob(tenant_id, name, send, stop);
                             });
               }));
  server_->Get(
      rest_paths::kJobLogs,
      Rpc("JobService.GetJobLogs",
          [this, jobs, &auth](const httplib::Request& request, httplib::Response& response) {
            auto id = CallerTenant(auth, request, response, JobAccess::kReadOrCancel);
            if (!id) return;
            absl::StatusOr<v1::GetJobLogsRequest> logs = ParseLogsRequest(request);
            if (!logs.ok()) return SendError(response, logs.status());
            if (auto job = jobs->GetJob(*id, logs->name()); !job.ok()) {
              return SendError(response, job.status());
            }
            StreamLines(response, stopping_, streams_, *id,
                        [jobs, tenant_id = *id, logs = *logs](const auto& send, const auto& stop) {
                          return jobs->StreamLogs(tenant_id, logs, send, stop);
                        });
          }));
}

void RestGateway::RouteNodes() {
  const Authenticator& auth = *backends_.auth;
  NodeManager* nodes = backends_.nodes;
  using Request = httplib::Request;
  server_->Get(rest_paths::kNodes,
               AdminRpc("NodeService.ListNodes", auth,
                        [nodes](const Request& request) -> absl::StatusOr<v1::ListNodesResponse> {
                          v1::ListNodesRequest list;
                          GRADHUB_RETURN_IF_ERROR(ParseListParams(request, &list));
                          return nodes->ListNodes(list);
                        }));
  server_->Get(rest_paths::kNode,
               AdminRpc("NodeService.GetNode", auth, [nodes](const Request& request) {
                 return nodes->GetNode(NodeName(request));
               }));
  Post(*server_, rest_paths::kNodeCordon,
       AdminRpc("NodeService.CordonNode", auth,
                [nodes](const Request& request) -> absl::StatusOr<v1::Node> {
                  GRADHUB_ASSIGN_OR_RETURN(const auto cordon, BodyNamed<v1::CordonNodeRequest>(
                                                                  request, NodeName(request)));
                  return nodes->CordonNode(cordon.name(), cordon.cordon());
                }));
  Post(*server_, rest_paths::kNodeDrain,
       AdminRpc("NodeService.DrainNode", auth,
                [this, nodes](const Request& request) -> absl::StatusOr<v1::Node> {
                  GRADHUB_ASSIGN_OR_RETURN(const auto drain, BodyNamed<v1::DrainNodeRequest>(
                                                                 request, NodeName(request)));
                  absl::StatusOr<v1::Node> node = nodes->DrainNode(drain.name());
                  if (backends_.on_nodes_changed) backends_.on_nodes_changed();
                  return node;
                }));
}

void RestGateway::RouteTenants() {
  const Authenticator& auth = *backends_.auth;
  TenantManager* tenants = backends_.tenants;
  using Request = httplib::Request;
  Post(*server_, rest_paths::kTenants,
       AdminRpc("AdminService.CreateTenant", auth,
                [tenants](const Request& request) -> absl::StatusOr<v1::Tenant> {
                  v1::CreateTenantRequest create;
                  GRADHUB_RETURN_IF_ERROR(ParseBody(request, create.mutable_tenant()));
                  create.set_tenant_id(request.get_param_value("tenantId"));
                  create.set_request_id(request.get_param_value("requestId"));
                  return tenants->CreateTenant(create);
                }));
  server_->Get(
      rest_paths::kTenants,
      AdminRpc("AdminService.ListTenants", auth,
               [tenants](const Request& request) -> absl::StatusOr<v1::ListTenantsResponse> {
                 v1::ListTenantsRequest list;
                 GRADHUB_RETURN_IF_ERROR(ParsePageParams(request, &list));
                 return tenants->ListTenants(list);
               }));
  Post(*server_, rest_paths::kTenantTokens,
       AdminRpc("AdminService.CreateToken", auth,
                [tenants](const Request& request) -> absl::StatusOr<v1::CreateTokenResponse> {
                  v1::CreateTokenRequest create;
                  GRADHUB_RETURN_IF_ERROR(ParseBody(request, create.mutable_token()));
                  create.set_parent(TenantName(request));
                  return tenants->CreateToken(create);
                }));
  Post(*server_, rest_paths::kTokenRevoke,
       AdminRpc("AdminService.RevokeToken", auth,
                [tenants](const Request& request) -> absl::StatusOr<v1::Token> {
                  GRADHUB_ASSIGN_OR_RETURN(
                      const auto revoke,
                      BodyNamed<v1::RevokeTokenRequest>(
                          request, TenantName(request) + "/tokens/" + request.matches[2].str()));
                  return tenants->RevokeToken(revoke);
                }));
}

void RestGateway::RouteAudit() {
  const AuditReader* reader = backends_.audit_events;
  auto list = [reader](const httplib::Request& request, httplib::Response& response) {
    if (reader == nullptr) {
      return SendError(response, absl::UnimplementedError("this server keeps no audit log"));
    }
    const absl::StatusOr<AuditScope> scope =
        reader->Authorize(request.get_header_value("Authorization"));
    if (!scope.ok()) return SendError(response, scope.status());
    v1::ListAuditEventsRequest events;
    if (const absl::Status parsed = ParseListParams(request, &events); !parsed.ok()) {
      return SendError(response, parsed);
    }
    Send(response, reader->List(*scope, events));
  };
  server_->Get("/v1/auditEvents", Rpc("AuditService.ListAuditEvents", std::move(list)));
}

}  // namespace gradhub::api
