#include "services/api/rest_gateway.h"

#include <google/protobuf/util/json_util.h>
#include <httplib.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace gradhub::api {
namespace {

using google::protobuf::Message;

// {"error": {"code": 400, "status": "INVALID_ARGUMENT", "message": "..."}} as Google APIs do.
void SendError(httplib::Response& response, const absl::Status& status) {
  response.status = HttpStatusFor(status.code());
  std::string message(status.message());
  std::string quoted;
  for (char c : message) {
    if (c == '"' || c == '\\') {
      quoted += '\\';
      quoted += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      quoted += ' ';
    } else {
      quoted += c;
    }
  }
  response.set_content(absl::StrCat("{\"error\":{\"code\":", response.status, ",\"status\":\"",
                                    absl::StatusCodeToString(status.code()), "\",\"message\":\"",
                                    quoted, "\"}}\n"),
                       "application/json");
}

void SendMessage(httplib::Response& response, const Message& message) {
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  (void)google::protobuf::util::MessageToJsonString(message, &json, options);
  response.status = 200;
  response.set_content(json + "\n", "application/json");
}

template <typename T>
void Send(httplib::Response& response, const absl::StatusOr<T>& result) {
  if (result.ok()) {
    SendMessage(response, *result);
  } else {
    SendError(response, result.status());
  }
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

}  // namespace

int HttpStatusFor(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk: return 200;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange: return 400;
    case absl::StatusCode::kUnauthenticated: return 401;
    case absl::StatusCode::kPermissionDenied: return 403;
    case absl::StatusCode::kNotFound: return 404;
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kAborted: return 409;
    case absl::StatusCode::kResourceExhausted: return 429;
    case absl::StatusCode::kCancelled: return 499;
    case absl::StatusCode::kUnimplemented: return 501;
    case absl::StatusCode::kUnavailable: return 503;
    case absl::StatusCode::kDeadlineExceeded: return 504;
    default: return 500;
  }
}

RestGateway::RestGateway(JobManager* jobs, const Authenticator* auth, RestGatewayOptions options)
    : jobs_(jobs), auth_(auth), options_(options), server_(std::make_unique<httplib::Server>()) {
  server_->set_payload_max_length(options_.max_body_bytes);
  Route();
}

RestGateway::~RestGateway() { Stop(); }

int RestGateway::Start(const std::string& host, int port) {
  const int bound = port == 0 ? server_->bind_to_any_port(host.c_str())
                              : (server_->bind_to_port(host.c_str(), port) ? port : -1);
  if (bound < 0) return -1;
  thread_ = std::thread([this] { server_->listen_after_bind(); });
  // The socket listens from bind on: requests queue in its backlog until the loop runs.
  return bound;
}

void RestGateway::Stop() {
  if (!thread_.joinable()) return;
  server_->stop();
  thread_.join();
}

void RestGateway::Route() {
  // The caller's tenant from the Authorization header; on failure the response is written.
  auto tenant = [this](const httplib::Request& request,
                       httplib::Response& response) -> std::optional<int64_t> {
    absl::StatusOr<Principal> principal = auth_->Authenticate(request.get_header_value("Authorization"));
    if (principal.ok() && principal->kind != Principal::Kind::kTenant) {
      principal = absl::PermissionDeniedError("jobs belong to tenants: use a tenant token");
    }
    if (!principal.ok()) {
      SendError(response, principal.status());
      return std::nullopt;
    }
    return principal->tenant_id;
  };

  // Liveness needs nothing but this process; readiness needs the database and its schema.
  server_->Get("/healthz", [](const httplib::Request&, httplib::Response& response) {
    response.set_content("ok\n", "text/plain");
  });
  server_->Get("/readyz", [this](const httplib::Request&, httplib::Response& response) {
    const absl::Status ready = jobs_->CheckReady();
    if (!ready.ok()) return SendError(response, ready);
    response.set_content("ok\n", "text/plain");
  });
  server_->Post("/v1/jobs", [this, tenant](const httplib::Request& request, httplib::Response& response) {
    auto id = tenant(request, response);
    if (!id) return;
    v1::JobSpec spec;
    if (auto parsed = ParseBody(request, &spec); !parsed.ok()) return SendError(response, parsed);
    Send(response, jobs_->CreateJob(*id, spec, request.get_param_value("requestId")));
  });
  server_->Get("/v1/jobs", [this, tenant](const httplib::Request& request, httplib::Response& response) {
    auto id = tenant(request, response);
    if (!id) return;
    v1::ListJobsRequest list;
    if (request.has_param("pageSize")) {
      int32_t size = 0;
      if (!absl::SimpleAtoi(request.get_param_value("pageSize"), &size)) {
        return SendError(response, absl::InvalidArgumentError("pageSize: not an integer"));
      }
      list.set_page_size(size);
    }
    list.set_page_token(request.get_param_value("pageToken"));
    list.set_filter(request.get_param_value("filter"));
    Send(response, jobs_->ListJobs(*id, list));
  });
  server_->Get(R"(/v1/jobs/([^/:]+))", [this, tenant](const httplib::Request& request, httplib::Response& response) {
    auto id = tenant(request, response);
    if (!id) return;
    Send(response, jobs_->GetJob(*id, "jobs/" + request.matches[1].str()));
  });
  server_->Post(R"(/v1/jobs/([^/:]+):cancel)", [this, tenant](const httplib::Request& request, httplib::Response& response) {
    auto id = tenant(request, response);
    if (!id) return;
    v1::CancelJobRequest cancel;
    if (auto parsed = ParseBody(request, &cancel); !parsed.ok()) return SendError(response, parsed);
    Send(response, jobs_->CancelJob(*id, "jobs/" + request.matches[1].str()));
  });
  server_->Get(R"(/v1/jobs/([^/:]+)/events)", [this, tenant](const httplib::Request& request, httplib::Response& response) {
    auto id = tenant(request, response);
    if (!id) return;
    Send(response, jobs_->ListJobEvents(*id, "jobs/" + request.matches[1].str()));
  });
  // httplib answers an oversized body with 413 itself; give it the same error shape.
  server_->set_error_handler([](const httplib::Request&, httplib::Response& response) {
    if (response.status == 413 && response.body.empty()) {
      SendError(response, absl::ResourceExhaustedError("request body is over the size limit"));
      response.status = 413;
    } else if (response.status == 404 && response.body.empty()) {
      SendError(response, absl::NotFoundError("no such resource"));
    }
  });
}

}  // namespace gradhub::api
