// gradhub.v1.AdminService over gRPC: tenants and their tokens, for the admin token only. An
// adapter: authenticate the admin, one TenantManager call, its status as the gRPC status.
#pragma once

#include "gradhub/v1/tenants.grpc.pb.h"
#include "services/api/tenant_manager.h"
#include "services/common/auth/authenticator.h"

namespace gradhub::api {

class AdminService final : public v1::AdminService::Service {
 public:
  // Not owned; both must outlive the service.
  AdminService(const Authenticator* auth, TenantManager* tenants)
      : auth_(auth), tenants_(tenants) {}

  grpc::Status CreateTenant(grpc::ServerContext* context, const v1::CreateTenantRequest* request,
                            v1::Tenant* response) override;
  grpc::Status ListTenants(grpc::ServerContext* context, const v1::ListTenantsRequest* request,
                           v1::ListTenantsResponse* response) override;
  grpc::Status CreateToken(grpc::ServerContext* context, const v1::CreateTokenRequest* request,
                           v1::CreateTokenResponse* response) override;
  grpc::Status RevokeToken(grpc::ServerContext* context, const v1::RevokeTokenRequest* request,
                           v1::Token* response) override;

 private:
  // True for the admin token; UNAUTHENTICATED or PERMISSION_DENIED otherwise.
  absl::StatusOr<bool> RequireAdmin(const grpc::ServerContext& context) const;

  const Authenticator* auth_;
  TenantManager* tenants_;
};

}  // namespace gradhub::api
