#include "services/api/rest_request.h"

#include <vector>

#include "services/common/contract/proto_json.h"
#include "services/common/text_rules.h"

namespace gradhub::api {

absl::Status ParseBody(const httplib::Request& request, google::protobuf::Message* message) {
  if (request.body.empty()) return absl::OkStatus();
  // Strict, shaped as the message, unknown fields refused, values the proto means.
  const absl::Status parsed = ParseProtoJson(request.body, message);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("request body: ", parsed.message()));
  }
  return absl::OkStatus();
}

absl::Status CheckRequestText(const httplib::Request& request) {
  std::vector<NamedText> texts(request.params.begin(), request.params.end());
  for (size_t i = 1; i < request.matches.size(); ++i) {
    texts.emplace_back("name", request.matches[i].str());
  }
  return CheckTexts(texts);
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

std::string JobName(const httplib::Request& request) { return "jobs/" + request.matches[1].str(); }
std::string NodeName(const httplib::Request& request) {
  return "nodes/" + request.matches[1].str();
}
std::string TenantName(const httplib::Request& request) {
  return "tenants/" + request.matches[1].str();
}

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

}  // namespace gradhub::api
