// The gRPC side of the audit log: a server interceptor that records every audited rpc
// (audited_calls.h) served by the server it is installed on, refused calls included, so that
// no service adapter carries audit code. For each audited call:
//   1. the first request message received gives the target its request names
//      (AuditedRpc::request_field, e.g. CancelJobRequest.name), read by reflection;
//   2. the response, when one is sent, gives the name of what the call returned or made
//      (its `name`, or that of its first message field: CreateTokenResponse.token.name);
//   3. as the status is about to be sent (before the client can see it), the call goes to
//      CallAuditor::Record with the `authorization` metadata, the peer and the status.
// Calls of other rpcs get no interceptor at all.
#pragma once

#include <grpcpp/support/server_interceptor.h>

#include <memory>
#include <string_view>

#include "services/common/audit/call_auditor.h"

namespace gradhub::audit {

// For ServerBuilder::experimental().SetInterceptorCreators; `auditor` must outlive the server.
std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> AuditInterceptorFactory(
    CallAuditor* auditor);

// A call of `method` as its handler sees it before acting: who (the `authorization`
// metadata), the transport and the peer; OK, no resource yet (CallAuditor::EventOf).
FinishedCall GrpcCallOf(const grpc::ServerContextBase& context, std::string_view method);

}  // namespace gradhub::audit
