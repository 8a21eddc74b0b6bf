// The REST gateway's request parsing (rest_gateway.h): an httplib request already read (path
// matches, query parameters, body) into the proto request of its rpc. Pure functions: no I/O,
// no managers, no database, so the fuzz target of the REST parser and router
// (tests/fuzz/rest_request_fuzz.cc) runs them as the gateway does, on hostile bytes.
// Thread-safe: every function only reads its arguments.
#pragma once

#include <google/protobuf/message.h>
#include <httplib.h>

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "gradhub/v1/jobs.pb.h"
#include "services/common/status_macros.h"

namespace gradhub::api {

// The gateway's routes, as httplib's path patterns (std::regex over the whole path; group 1
// is the resource's id, group 2 a token's). The gateway and the fuzz target route by these.
namespace rest_paths {
inline constexpr char kJobs[] = "/v1/jobs";
inline constexpr char kJob[] = R"(/v1/jobs/([^/:]+))";
inline constexpr char kJobCancel[] = R"(/v1/jobs/([^/:]+):cancel)";
inline constexpr char kJobEvents[] = R"(/v1/jobs/([^/:]+)/events)";
inline constexpr char kJobMetrics[] = R"(/v1/jobs/([^/:]+)/metrics)";
inline constexpr char kJobWatch[] = R"(/v1/jobs/([^/:]+):watch)";
inline constexpr char kJobLogs[] = R"(/v1/jobs/([^/:]+)/logs)";
inline constexpr char kNodes[] = "/v1/nodes";
inline constexpr char kNode[] = R"(/v1/nodes/([^/:]+))";
inline constexpr char kNodeCordon[] = R"(/v1/nodes/([^/:]+):cordon)";
inline constexpr char kNodeDrain[] = R"(/v1/nodes/([^/:]+):drain)";
inline constexpr char kTenants[] = "/v1/tenants";
inline constexpr char kTenantTokens[] = R"(/v1/tenants/([^/:]+)/tokens)";
inline constexpr char kTokenRevoke[] = R"(/v1/tenants/([^/:]+)/tokens/([^/:]+):revoke)";
}  // namespace rest_paths

// Every query parameter and path segment is text a handler may store or match (a request id,
// a filter, a page token, a name): NUL and invalid UTF-8 are refused naming it (text_rules.h).
// The gateway checks it before any handler reads the request. A body's strings are ParseBody's.
absl::Status CheckRequestText(const httplib::Request& request);

// An empty body is the empty message; otherwise proto3 JSON, unknown fields refused.
absl::Status ParseBody(const httplib::Request& request, google::protobuf::Message* message);

// An integer query parameter, left unchanged when absent; INVALID_ARGUMENT naming it.
template <typename Int>
absl::Status IntParam(const httplib::Request& request, const char* name, Int* value) {
  if (!request.has_param(name)) return absl::OkStatus();
  if (!absl::SimpleAtoi(request.get_param_value(name), value)) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": not an integer"));
  }
  return absl::OkStatus();
}

// "true"/"1" or "false"/"0", left unchanged when absent; INVALID_ARGUMENT naming it.
absl::Status BoolParam(const httplib::Request& request, const char* name, bool* value);

// pageSize and pageToken into any List*Request; INVALID_ARGUMENT naming a bad one.
template <typename ListRequest>
absl::Status ParsePageParams(const httplib::Request& request, ListRequest* list) {
  int32_t page_size = 0;
  GRADHUB_RETURN_IF_ERROR(IntParam(request, "pageSize", &page_size));
  list->set_page_size(page_size);
  list->set_page_token(request.get_param_value("pageToken"));
  return absl::OkStatus();
}

// The page and the filter, for the List*Requests that have one.
template <typename ListRequest>
absl::Status ParseListParams(const httplib::Request& request, ListRequest* list) {
  GRADHUB_RETURN_IF_ERROR(ParsePageParams(request, list));
  list->set_filter(request.get_param_value("filter"));
  return absl::OkStatus();
}

// The resource names in a matched path: "jobs/<group 1>", and so on.
std::string JobName(const httplib::Request& request);
std::string NodeName(const httplib::Request& request);
std::string TenantName(const httplib::Request& request);

// The message of a POST whose body is the request and whose path names the resource: the body
// parsed (unknown fields refused), then the name from the path, which wins over the body's.
template <typename Request>
absl::StatusOr<Request> BodyNamed(const httplib::Request& request, const std::string& name) {
  Request message;
  GRADHUB_RETURN_IF_ERROR(ParseBody(request, &message));
  message.set_name(name);
  return message;
}

// GetJobLogs' query: attempt, rank, afterSeq, follow; INVALID_ARGUMENT naming a bad one.
absl::StatusOr<v1::GetJobLogsRequest> ParseLogsRequest(const httplib::Request& request);

}  // namespace gradhub::api
