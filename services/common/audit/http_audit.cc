#include "services/common/audit/http_audit.h"

#include <httplib.h>

#include <nlohmann/json.hpp>
#include <string>

#include "services/common/audit/audited_calls.h"
#include "services/common/http_errors.h"

namespace gradhub::audit {
namespace {

// A body's JSON object, or a discarded value for anything else (no exception).
nlohmann::json ParseObject(const std::string& body) {
  nlohmann::json json = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (!json.is_object()) return nlohmann::json(nlohmann::json::value_t::discarded);
  return json;
}

std::string NameIn(const nlohmann::json& object) {
  const auto name = object.find("name");
  return name != object.end() && name->is_string() ? name->get<std::string>() : "";
}

// What a 2xx answer names: its `name`, else that of an object member (CreateTokenResponse's
// token), as grpc_audit.cc reads a response message.
std::string ReturnedName(const std::string& body) {
  const nlohmann::json json = ParseObject(body);
  if (json.is_discarded()) return "";
  if (std::string name = NameIn(json); !name.empty()) return name;
  for (const auto& member : json) {
    if (member.is_object()) return NameIn(member);
  }
  return "";
}

// The outcome of an error answer: its body's status and message, as every gradhub REST server
// writes them (http_errors.h); else what its HTTP status means.
absl::Status ErrorOf(const httplib::Response& response) {
  const nlohmann::json json = ParseObject(response.body);
  if (!json.is_discarded() && json.contains("error") && json["error"].is_object()) {
    const nlohmann::json& error = json["error"];
    const std::string status = error.value("status", "");
    const std::string message = error.value("message", "");
    if (std::optional<absl::StatusCode> code = OutcomeCode(status); code && status != "OK") {
      return absl::Status(*code, message);
    }
  }
  return StatusForHttpError(response.status);
}

void Audit(CallAuditor& auditor, const httplib::Request& request,
           const httplib::Response& response) {
  const std::optional<HttpCall> call = MatchHttpCall(
      request.method, request.path,
      [&request](const std::string& name) { return request.get_param_value(name.c_str()); });
  if (!call) return;
  const bool ok = response.status >= 200 && response.status < 300;
  FinishedCall finished = RestCallOf(request, call->rpc->method);
  finished.resource = ResourceOf(ok, ok ? ReturnedName(response.body) : "", call->target);
  finished.outcome = ok ? absl::OkStatus() : ErrorOf(response);
  auditor.Record(finished);
}

}  // namespace

FinishedCall RestCallOf(const httplib::Request& request, std::string_view method) {
  return {.method = method,
          .authorization = request.get_header_value("Authorization"),
          .transport = "rest",
          .peer = HttpPeerAddress(request.remote_addr, request.remote_port)};
}

void AuditHttpCalls(httplib::Server& server, CallAuditor* auditor) {
  server.set_post_routing_handler(
      [auditor](const httplib::Request& request, httplib::Response& response) {
        // No audited rpc is a GET: probes, reads and streams leave at once.
        if (request.method == "GET" || request.method == "HEAD") return;
        Audit(*auditor, request, response);
      });
}

}  // namespace gradhub::audit
