#include "services/api/audit_service.h"

#include "services/common/auth/call_authorization.h"
#include "services/common/grpc_status.h"

namespace gradhub::api {

grpc::Status AuditService::ListAuditEvents(grpc::ServerContext* context,
                                           const v1::ListAuditEventsRequest* request,
                                           v1::ListAuditEventsResponse* response) {
  return AnswerFor(reader_->Authorize(AuthorizationOf(*context)), response,
                   [&](const AuditScope& scope) { return reader_->List(scope, *request); });
}

}  // namespace gradhub::api
