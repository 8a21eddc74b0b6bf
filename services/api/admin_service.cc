#include "services/api/admin_service.h"

#include "services/common/auth/call_authorization.h"
#include "services/common/grpc_status.h"
#include "services/common/status_macros.h"

namespace gradhub::api {

absl::StatusOr<bool> AdminService::RequireAdmin(const grpc::ServerContext& context) const {
  GRADHUB_RETURN_IF_ERROR(auth_->RequireAdmin(AuthorizationOf(context)));
  return true;
}

grpc::Status AdminService::CreateTenant(grpc::ServerContext* context,
                                        const v1::CreateTenantRequest* request,
                                        v1::Tenant* response) {
  return AnswerFor(RequireAdmin(*context), response,
                   [&](bool) { return tenants_->CreateTenant(*request); });
}

grpc::Status AdminService::ListTenants(grpc::ServerContext* context,
                                       const v1::ListTenantsRequest* request,
                                       v1::ListTenantsResponse* response) {
  return AnswerFor(RequireAdmin(*context), response,
                   [&](bool) { return tenants_->ListTenants(*request); });
}

grpc::Status AdminService::CreateToken(grpc::ServerContext* context,
                                       const v1::CreateTokenRequest* request,
                                       v1::CreateTokenResponse* response) {
  return AnswerFor(RequireAdmin(*context), response,
                   [&](bool) { return tenants_->CreateToken(*request); });
}

grpc::Status AdminService::RevokeToken(grpc::ServerContext* context,
                                       const v1::RevokeTokenRequest* request, v1::Token* response) {
  return AnswerFor(RequireAdmin(*context), response,
                   [&](bool) { return tenants_->RevokeToken(*request); });
}

}  // namespace gradhub::api
