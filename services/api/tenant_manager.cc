#include "services/api/tenant_manager.h"

#include <google/protobuf/util/time_util.h>

#include <regex>
#include <string>

#include "absl/strings/str_cat.h"
#include "services/common/job_records.h"
#include "services/common/page_token.h"
#include "services/common/status_macros.h"

namespace gradhub::api {
namespace {

using google::protobuf::util::TimeUtil;

std::string TokenName(const std::string& tenant, int64_t id) {
  return absl::StrCat("tenants/", tenant.empty() ? "-" : tenant, "/tokens/", id);
}

// The tenant of a token's parent, tenants/{tenant_id}.
absl::StatusOr<std::string> ParentTenant(const std::string& parent) {
  static const std::regex kParent("tenants/([a-z][a-z0-9-]{0,62})");
  std::smatch match;
  if (!std::regex_match(parent, match, kParent)) {
    return absl::InvalidArgumentError("parent: '" + parent + "' is not tenants/{tenant_id}");
  }
  return match[1].str();
}

}  // namespace

absl::StatusOr<v1::Tenant> TenantManager::CreateTenant(const v1::CreateTenantRequest& request) {
  GRADHUB_RETURN_IF_ERROR(
      auth_
          ->CreateTenant(request.tenant_id(), request.tenant().display_name(), request.request_id())
          .status());
  v1::Tenant tenant;
  tenant.set_name("tenants/" + request.tenant_id());
  tenant.set_display_name(request.tenant().display_name());
  *tenant.mutable_create_time() = TimeUtil::GetCurrentTime();
  return tenant;
}

absl::StatusOr<v1::ListTenantsResponse> TenantManager::ListTenants(
    const v1::ListTenantsRequest& request) {
  GRADHUB_ASSIGN_OR_RETURN(const int32_t page_size, ListPageSize(request.page_size()));
  // The name of the last tenant of the page before (page_token.h).
  GRADHUB_ASSIGN_OR_RETURN(const std::string after,
                           ReadNamePageToken(request.page_token(), "tenants"));
  // One more than a page tells whether another page follows.
  GRADHUB_ASSIGN_OR_RETURN(std::vector<TenantRecord> records,
                           auth_->ListTenants(after, page_size + 1));
  v1::ListTenantsResponse response;
  for (size_t i = 0; i < records.size() && i < static_cast<size_t>(page_size); ++i) {
    v1::Tenant& tenant = *response.add_tenants();
    tenant.set_name("tenants/" + records[i].name);
    tenant.set_display_name(records[i].display_name);
    *tenant.mutable_create_time() = TimeUtil::MicrosecondsToTimestamp(records[i].create_us);
  }
  if (records.size() > static_cast<size_t>(page_size)) {
    response.set_next_page_token(MakePageToken("tenants", {records[page_size - 1].name}));
  }
  return response;
}

absl::StatusOr<v1::CreateTokenResponse> TenantManager::CreateToken(
    const v1::CreateTokenRequest& request) {
  const v1::Token& wanted = request.token();
  std::string tenant;
  absl::StatusOr<NewToken> token;
  if (wanted.kind() == v1::Token::NODE) {
    token = auth_->CreateNodeToken(wanted.description());
  } else if (wanted.kind() == v1::Token::TENANT) {
    GRADHUB_ASSIGN_OR_RETURN(tenant, ParentTenant(request.parent()));
    token = auth_->CreateTenantToken(tenant, wanted.description());
  } else {
    return absl::InvalidArgumentError("token.kind: TENANT or NODE");
  }
  GRADHUB_RETURN_IF_ERROR(token.status());
  v1::CreateTokenResponse response;
  v1::Token& created = *response.mutable_token();
  created.set_name(TokenName(tenant, token->id));
  created.set_kind(wanted.kind());
  created.set_description(wanted.description());
  created.set_prefix(token->prefix);
  *created.mutable_create_time() = TimeUtil::GetCurrentTime();
  response.set_secret(token->secret);
  return response;
}

absl::StatusOr<v1::Token> TenantManager::RevokeToken(const v1::RevokeTokenRequest& request) {
  static const std::regex kName("tenants/([a-z][a-z0-9-]{0,62}|-)/tokens/([0-9]{1,18})");
  std::smatch match;
  if (!std::regex_match(request.name(), match, kName)) {
    return absl::InvalidArgumentError("name: '" + request.name() +
                                      "' is not tenants/{tenant}/tokens/{id}");
  }
  const std::string tenant = match[1].str() == "-" ? "" : match[1].str();
  GRADHUB_ASSIGN_OR_RETURN(const TokenRecord record,
                           auth_->RevokeToken(tenant, std::stoll(match[2].str())));
  v1::Token token;
  token.set_name(request.name());
  token.set_kind(record.kind == "NODE" ? v1::Token::NODE : v1::Token::TENANT);
  token.set_description(record.description);
  token.set_prefix(record.prefix);
  *token.mutable_create_time() = TimeUtil::MicrosecondsToTimestamp(record.create_us);
  *token.mutable_revoke_time() = TimeUtil::MicrosecondsToTimestamp(record.revoke_us);
  return token;
}

}  // namespace gradhub::api
