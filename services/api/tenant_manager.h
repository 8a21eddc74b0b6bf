// The admin operations on tenants and tokens (tenants.proto's AdminService) as their messages:
// resource names parsed and checked, pages cut, timestamps filled in. The records themselves
// live in Authenticator; AdminService only authenticates the admin and calls one method here.
#pragma once

#include "absl/status/statusor.h"
#include "gradhub/v1/tenants.pb.h"
#include "services/common/auth/authenticator.h"

namespace gradhub::api {

// Thread-safe as Authenticator is: it keeps no state of its own.
class TenantManager {
 public:
  // Not owned; must outlive the manager.
  explicit TenantManager(Authenticator* auth) : auth_(auth) {}

  // INVALID_ARGUMENT naming `tenant_id` for a bad name; ALREADY_EXISTS when taken.
  absl::StatusOr<v1::Tenant> CreateTenant(const v1::CreateTenantRequest& request);
  // Sorted by name; `page_token` (page_token.h) holds the last name of the previous page.
  absl::StatusOr<v1::ListTenantsResponse> ListTenants(const v1::ListTenantsRequest& request);
  // A TENANT token under `parent` (tenants/{tenant_id}); a NODE token belongs to no tenant,
  // its parent is not used and its name is `tenants/-/tokens/{id}`. The secret is in the
  // answer only: it is never stored.
  absl::StatusOr<v1::CreateTokenResponse> CreateToken(const v1::CreateTokenRequest& request);
  // `name` is tenants/{tenant or -}/tokens/{id}; idempotent.
  absl::StatusOr<v1::Token> RevokeToken(const v1::RevokeTokenRequest& request);

 private:
  Authenticator* auth_;
};

}  // namespace gradhub::api
