#include "services/api/admin_service.h"

#include <google/protobuf/util/time_util.h>

#include <regex>

#include "absl/strings/str_cat.h"
#include "services/api/job_records.h"
#include "services/api/job_service.h"
#include "services/api/call_authorization.h"
#include "services/common/grpc_status.h"

namespace gradhub::api {
namespace {

using google::protobuf::util::TimeUtil;

std::string TokenName(const std::string& tenant, int64_t id) {
  return absl::StrCat("tenants/", tenant.empty() ? "-" : tenant, "/tokens/", id);
}

}  // namespace

absl::Status AdminService::RequireAdmin(const grpc::ServerContext& context) const {
  absl::StatusOr<Principal> principal = auth_->Authenticate(AuthorizationOf(context));
  if (!principal.ok()) return principal.status();
  if (principal->kind != Principal::Kind::kAdmin) {
    return absl::PermissionDeniedError("tenants and tokens are managed with the admin token");
  }
  return absl::OkStatus();
}

grpc::Status AdminService::CreateTenant(grpc::ServerContext* context,
                                        const v1::CreateTenantRequest* request,
                                        v1::Tenant* response) {
  if (auto status = RequireAdmin(*context); !status.ok()) return ToGrpc(status);
  absl::StatusOr<int64_t> id =
      auth_->CreateTenant(request->tenant_id(), request->tenant().display_name());
  if (!id.ok()) return ToGrpc(id.status());
  response->set_name("tenants/" + request->tenant_id());
  response->set_display_name(request->tenant().display_name());
  *response->mutable_create_time() = TimeUtil::GetCurrentTime();
  return grpc::Status::OK;
}

grpc::Status AdminService::ListTenants(grpc::ServerContext* context,
                                       const v1::ListTenantsRequest* request,
                                       v1::ListTenantsResponse* response) {
  if (auto status = RequireAdmin(*context); !status.ok()) return ToGrpc(status);
  const absl::StatusOr<int32_t> page_size_or = ListPageSize(request->page_size());
  if (!page_size_or.ok()) return ToGrpc(page_size_or.status());
  const int32_t page_size = *page_size_or;
  auto tenants = auth_->ListTenants(request->page_token(), page_size + 1);
  if (!tenants.ok()) return ToGrpc(tenants.status());
  for (size_t i = 0; i < tenants->size() && i < static_cast<size_t>(page_size); ++i) {
    v1::Tenant& tenant = *response->add_tenants();
    tenant.set_name("tenants/" + (*tenants)[i].name);
    tenant.set_display_name((*tenants)[i].display_name);
    *tenant.mutable_create_time() = TimeUtil::MicrosecondsToTimestamp((*tenants)[i].create_us);
  }
  if (tenants->size() > static_cast<size_t>(page_size)) {
    response->set_next_page_token((*tenants)[page_size - 1].name);
  }
  return grpc::Status::OK;
}

grpc::Status AdminService::CreateToken(grpc::ServerContext* context,
                                       const v1::CreateTokenRequest* request,
                                       v1::CreateTokenResponse* response) {
  if (auto status = RequireAdmin(*context); !status.ok()) return ToGrpc(status);
  const v1::Token& wanted = request->token();
  std::string tenant;
  absl::StatusOr<NewToken> token;
  if (wanted.kind() == v1::Token::NODE) {
    token = auth_->CreateNodeToken(wanted.description());
  } else if (wanted.kind() == v1::Token::TENANT) {
    static const std::regex kParent("tenants/([a-z][a-z0-9-]{0,62})");
    std::smatch match;
    if (!std::regex_match(request->parent(), match, kParent)) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "parent: '" + request->parent() + "' is not tenants/{tenant_id}");
    }
    tenant = match[1].str();
    token = auth_->CreateTenantToken(tenant, wanted.description());
  } else {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "token.kind: TENANT or NODE");
  }
  if (!token.ok()) return ToGrpc(token.status());
  v1::Token& created = *response->mutable_token();
  created.set_name(TokenName(tenant, token->id));
  created.set_kind(wanted.kind());
  created.set_description(wanted.description());
  created.set_prefix(token->prefix);
  *created.mutable_create_time() = TimeUtil::GetCurrentTime();
  response->set_secret(token->secret);
  return grpc::Status::OK;
}

grpc::Status AdminService::RevokeToken(grpc::ServerContext* context,
                                       const v1::RevokeTokenRequest* request,
                                       v1::Token* response) {
  if (auto status = RequireAdmin(*context); !status.ok()) return ToGrpc(status);
  static const std::regex kName("tenants/([a-z][a-z0-9-]{0,62}|-)/tokens/([0-9]{1,18})");
  std::smatch match;
  if (!std::regex_match(request->name(), match, kName)) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "name: '" + request->name() + "' is not tenants/{tenant}/tokens/{id}");
  }
  const std::string tenant = match[1].str() == "-" ? "" : match[1].str();
  absl::StatusOr<TokenRecord> token = auth_->RevokeToken(tenant, std::stoll(match[2].str()));
  if (!token.ok()) return ToGrpc(token.status());
  response->set_name(request->name());
  response->set_kind(token->kind == "NODE" ? v1::Token::NODE : v1::Token::TENANT);
  response->set_description(token->description);
  response->set_prefix(token->prefix);
  *response->mutable_create_time() = TimeUtil::MicrosecondsToTimestamp(token->create_us);
  *response->mutable_revoke_time() = TimeUtil::MicrosecondsToTimestamp(token->revoke_us);
  return grpc::Status::OK;
}

}  // namespace gradhub::api
