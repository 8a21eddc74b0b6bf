// gradhub.v1.AuditService over gRPC: an adapter over AuditReader (who may read which events,
// the filter, the pages), whose absl::Status is the gRPC status.
#pragma once

#include "gradhub/v1/audit.grpc.pb.h"
#include "services/api/audit_reader.h"

namespace gradhub::api {

class AuditService final : public v1::AuditService::Service {
 public:
  // Not owned; must outlive the service.
  explicit AuditService(const AuditReader* reader) : reader_(reader) {}

  grpc::Status ListAuditEvents(grpc::ServerContext* context,
                               const v1::ListAuditEventsRequest* request,
                               v1::ListAuditEventsResponse* response) override;

 private:
  const AuditReader* reader_;
};

}  // namespace gradhub::api
