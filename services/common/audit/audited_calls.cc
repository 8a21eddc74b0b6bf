#include "services/common/audit/audited_calls.h"

#include <regex>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "services/common/job_records.h"
#include "services/common/text_rules.h"

namespace gradhub::audit {
namespace {

using api::Principal;

constexpr char kTenantsPrefix[] = "tenants/";

// {1}, {2}: groups of `match`; {name}: the query parameter `name`.
std::string ExpandTarget(std::string_view pattern, const std::smatch& match,
                         const std::function<std::string(const std::string&)>& query_param) {
  std::string target;
  size_t pos = 0;
  while (pos < pattern.size()) {
    const size_t open = pattern.find('{', pos);
    const size_t close = open == std::string_view::npos ? open : pattern.find('}', open);
    if (close == std::string_view::npos) {
      target.append(pattern.substr(pos));
      break;
    }
    target.append(pattern.substr(pos, open - pos));
    const std::string key(pattern.substr(open + 1, close - open - 1));
    const bool group = key.size() == 1 && key[0] >= '1' && key[0] <= '9';
    target += group ? match[key[0] - '0'].str() : query_param(key);
    pos = close + 1;
  }
  return target;
}

}  // namespace

const std::vector<AuditedRpc>& AuditedRpcs() {
  static const auto* const kRpcs = new std::vector<AuditedRpc>{
      {kCreateJobMethod, "", "", "POST", "/v1/jobs", "",
       /*ok_event_written_by_handler=*/true},
      {"gradhub.v1.JobService/CancelJob", "name", "", "POST", "/v1/jobs/([^/:]+):cancel",
       "jobs/{1}"},
      {"gradhub.v1.AdminService/CreateTenant", "tenant_id", kTenantsPrefix, "POST", "/v1/tenants",
       "tenants/{tenantId}"},
      {"gradhub.v1.AdminService/CreateToken", "parent", "", "POST", "/v1/tenants/([^/:]+)/tokens",
       "tenants/{1}"},
      {"gradhub.v1.AdminService/RevokeToken", "name", "", "POST",
       "/v1/tenants/([^/:]+)/tokens/([^/:]+):revoke", "tenants/{1}/tokens/{2}"},
      {"gradhub.v1.NodeService/CordonNode", "name", "", "POST", "/v1/nodes/([^/:]+):cordon",
       "nodes/{1}"},
      {"gradhub.v1.NodeService/DrainNode", "name", "", "POST", "/v1/nodes/([^/:]+):drain",
       "nodes/{1}"},
      {"gradhub.v1.CheckpointService/DeleteCheckpoint", "name", "", "DELETE",
       "/v1/jobs/([^/:]+)/checkpoints/([^/:]+)", "jobs/{1}/checkpoints/{2}"},
      {"gradhub.v1.CodeService/UploadCode", "", "", "PUT", "/v1/code", ""},
  };
  return *kRpcs;
}

const AuditedRpc* FindAuditedRpc(std::string_view method) {
  if (!method.empty() && method.front() == '/') method.remove_prefix(1);
  for (const AuditedRpc& rpc : AuditedRpcs()) {
    if (rpc.method == method) return &rpc;
  }
  return nullptr;
}

std::optional<HttpCall> MatchHttpCall(
    std::string_view http_method, const std::string& path,
    const std::function<std::string(const std::string&)>& query_param) {
  // Compiled once, in the order of AuditedRpcs().
  static const auto* const kPaths = [] {
    auto* paths = new std::vector<std::regex>;
    for (const AuditedRpc& rpc : AuditedRpcs()) paths->emplace_back(std::string(rpc.http_path));
    return paths;
  }();
  const std::vector<AuditedRpc>& rpcs = AuditedRpcs();
  for (size_t i = 0; i < rpcs.size(); ++i) {
    std::smatch match;
    if (rpcs[i].http_method != http_method || !std::regex_match(path, match, (*kPaths)[i])) {
      continue;
    }
    return HttpCall{&rpcs[i], ExpandTarget(rpcs[i].http_target, match, query_param)};
  }
  return std::nullopt;
}

std::string ResourceOf(bool ok, const std::string& returned_name, const std::string& target) {
  return ok && !returned_name.empty() ? returned_name : target;
}

std::string ActorName(const absl::StatusOr<Principal>& caller) {
  if (!caller.ok()) return kUnauthenticatedActor;
  if (caller->kind == Principal::Kind::kAdmin) return "admin";
  const std::string tenant =
      caller->kind == Principal::Kind::kTenant ? caller->tenant_name : std::string("-");
  return absl::StrCat(kTenantsPrefix, tenant, "/tokens/", caller->token_id);
}

std::string TenantOf(const absl::StatusOr<Principal>& caller, const std::string& resource) {
  if (caller.ok() &&
      (caller->kind == Principal::Kind::kTenant || caller->kind == Principal::Kind::kJob)) {
    return kTenantsPrefix + caller->tenant_name;
  }
  if (resource.rfind(kTenantsPrefix, 0) != 0) return "";
  const std::string tenant = resource.substr(0, resource.find('/', sizeof(kTenantsPrefix) - 1));
  return tenant == "tenants/-" || tenant == kTenantsPrefix ? "" : tenant;
}

std::string JobOfResource(const std::string& resource) {
  const size_t end = resource.find('/', 5);
  return api::JobId(resource.substr(0, end));
}

std::string OutcomeName(absl::StatusCode code) { return absl::StatusCodeToString(code); }

std::optional<absl::StatusCode> OutcomeCode(std::string_view name) {
  // google.rpc.Code: OK (0) to UNAUTHENTICATED (16).
  for (int number = 0; number <= 16; ++number) {
    const auto code = static_cast<absl::StatusCode>(number);
    if (OutcomeName(code) == name) return code;
  }
  return std::nullopt;
}

std::string BoundedText(absl::string_view text, size_t max_chars) {
  std::string out;
  size_t chars = 0;
  for (size_t i = 0; i < text.size() && chars < max_chars; ++chars) {
    const size_t length = Utf8SequenceLength(std::string_view(text.data(), text.size()), i);
    if (length == 0 || text[i] == '\0') {
      out += "\xEF\xBF\xBD";  // U+FFFD
      ++i;
    } else {
      out.append(text.data() + i, length);
      i += length;
    }
  }
  return out;
}

std::string GrpcPeerAddress(const std::string& grpc_peer) {
  absl::string_view peer = grpc_peer;
  for (absl::string_view scheme : {"ipv4:", "ipv6:"}) {
    if (peer.substr(0, scheme.size()) == scheme) peer.remove_prefix(scheme.size());
  }
  return BoundedText(peer, kMaxNameChars);
}

std::string HttpPeerAddress(const std::string& address, int port) {
  const bool v6 = address.find(':') != std::string::npos;
  return BoundedText(absl::StrCat(v6 ? "[" : "", address, v6 ? "]" : "", ":", port), kMaxNameChars);
}

}  // namespace gradhub::audit
