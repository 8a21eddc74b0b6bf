// The REST side of the audit log: cpp-httplib's post-routing hook, which runs for every request
// after its handler (or httplib's own error answer) and before a byte of the answer is sent.
// For a request that is an audited rpc (MatchHttpCall: method and path, as the protos' `REST:`
// comments route them), whatever route or hook answered it:
//   1. the target comes from the path (and CreateTenant's tenantId);
//   2. a 2xx answer is OK, and the `name` of its JSON body (or of body.token) is what the call
//      made or returned; any other answer's outcome and message come from its error body
//      ({"error": {"status": "NOT_FOUND", "message": ...}}), or from its HTTP status;
//   3. the call goes to CallAuditor::Record with the Authorization header and the client's
//      address.
// Other requests (GETs, probes, streams) cost one comparison of their method.
#pragma once

#include <string_view>

#include "services/common/audit/call_auditor.h"

namespace httplib {
struct Request;
class Server;
}  // namespace httplib

namespace gradhub::audit {

// Installs the hook; `server` must have no post-routing handler of its own, and `auditor` must
// outlive its serving loop.
void AuditHttpCalls(httplib::Server& server, CallAuditor* auditor);

// A request for `method` as its handler sees it before acting: who (the Authorization
// header), the transport and the client's address; OK, no resource yet (CallAuditor::EventOf).
FinishedCall RestCallOf(const httplib::Request& request, std::string_view method);

}  // namespace gradhub::audit
