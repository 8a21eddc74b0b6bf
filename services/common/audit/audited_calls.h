// What the audit log records, as pure rules (no database, no server): which rpcs are audited
// and where each transport names what they act on; who the actor is; which tenant an event
// belongs to; how an outcome and free text are written down. The recorder (call_auditor.h) and
// both transports' hooks (grpc_audit.h, http_audit.h) apply them; audited_calls_test.cc has a
// test per rule.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "services/common/auth/authenticator.h"

namespace gradhub::audit {

// One audited rpc (audit.proto's list) and where its target is named on each transport.
struct AuditedRpc {
  std::string_view method;  // gradhub.v1.JobService/CancelJob
  // gRPC: the request's string field that names the target, "" for none, and the prefix that
  // makes its value a resource name (CreateTenant's tenant_id "acme" -> "tenants/acme").
  std::string_view request_field;
  std::string_view request_prefix;
  // REST, as the proto's `REST:` comment routes it: the HTTP method, the path as a regular
  // expression, and the target built from it: {1}, {2} are the path's groups, {tenantId} a
  // query parameter.
  std::string_view http_method;
  std::string_view http_path;
  std::string_view http_target;
  // Whether the call's handler writes the event of its OK outcome itself, in the transaction
  // of the change it makes, so that the call waits for one commit instead of two (CreateJob:
  // the job, its first job event and its audit event are one statement). The transports then
  // record only its other outcomes (CallAuditor::Record).
  bool ok_event_written_by_handler = false;
};

// The method of the one rpc whose handler writes its OK event (ok_event_written_by_handler).
inline constexpr char kCreateJobMethod[] = "gradhub.v1.JobService/CreateJob";

// CreateJob, CancelJob, CreateTenant, CreateToken, RevokeToken, CordonNode (uncordon too),
// DrainNode, DeleteCheckpoint, UploadCode.
const std::vector<AuditedRpc>& AuditedRpcs();

// By gRPC's method path (/gradhub.v1.JobService/CancelJob) or the full name without the
// leading slash; nullptr when the rpc is not audited.
const AuditedRpc* FindAuditedRpc(std::string_view method);

// The audited rpc an HTTP request is, and its target; nullopt for any other request.
// `query_param` reads a query parameter ("" when absent).
struct HttpCall {
  const AuditedRpc* rpc = nullptr;
  std::string target;
};
std::optional<HttpCall> MatchHttpCall(
    std::string_view http_method, const std::string& path,
    const std::function<std::string(const std::string&)>& query_param);

// The resource an event names: what the call returned (a created job, token or archive) when
// it succeeded and returned a name, else the target its request named ("" for a failed
// create: nothing was made).
std::string ResourceOf(bool ok, const std::string& returned_name, const std::string& target);

// Who: "admin"; a token's name, tenants/{t}/tokens/{id} (tenants/-/tokens/{id} for node and
// job tokens, which belong to no tenant); "unauthenticated" when the token was refused.
inline constexpr char kUnauthenticatedActor[] = "unauthenticated";
std::string ActorName(const absl::StatusOr<api::Principal>& caller);

// The tenant an event belongs to, which is the one that may read it: a tenant's (or a script
// rank's) own tenant, whatever it named, so that a tenant's probes of another's resources stay
// in its own log; for the admin, node tokens and refused tokens, the tenant the resource names
// (tenants/{t}/...). "" otherwise: then JobOfResource may name a job whose tenant it is.
std::string TenantOf(const absl::StatusOr<api::Principal>& caller, const std::string& resource);

// jobs/{uuid} or jobs/{uuid}/... -> the uuid; "" for anything else.
std::string JobOfResource(const std::string& resource);

// "OK", or the gRPC code's name ("PERMISSION_DENIED").
std::string OutcomeName(absl::StatusCode code);
// The code OutcomeName gives `name`; nullopt for a name no code has.
std::optional<absl::StatusCode> OutcomeCode(std::string_view name);

// At most audit.proto's 512 characters of an error message.
inline constexpr size_t kMaxMessageChars = 512;
// Resources and peers come from clients: bounded too.
inline constexpr size_t kMaxNameChars = 512;

// `text` as PostgreSQL text takes it: invalid UTF-8 and NUL each become U+FFFD, and at most
// `max_chars` characters (code points) are kept.
std::string BoundedText(absl::string_view text, size_t max_chars);

// A client's address as host:port ([v6]:port), from gRPC's peer ("ipv4:127.0.0.1:5000",
// "ipv6:[::1]:5000") or from an HTTP server's address and port.
std::string GrpcPeerAddress(const std::string& grpc_peer);
std::string HttpPeerAddress(const std::string& address, int port);

}  // namespace gradhub::audit
