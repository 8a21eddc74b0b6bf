// Bearer tokens: tenants and their tokens, node tokens for agents, and the admin token that
// bootstraps both. Only the SHA-256 of a token is stored, so a copy of the database does not
// let anyone in; the secret is shown once, when it is created.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "services/common/db/pool.h"

namespace gradhub::api {

struct Principal {
  enum class Kind { kAdmin, kTenant, kNode };
  Kind kind = Kind::kTenant;
  int64_t tenant_id = 0;    // kTenant only
  std::string tenant_name;  // kTenant only
};

struct TenantRecord {
  std::string name, display_name;
  int64_t create_us = 0;
};

struct TokenRecord {
  int64_t id = 0;
  std::string tenant;  // empty for node tokens
  std::string kind;    // "TENANT" or "NODE"
  std::string prefix, description;
  int64_t create_us = 0, revoke_us = 0;
};

struct NewToken {
  int64_t id = 0;
  std::string secret;  // "ghk_" + 64 hex characters; never stored
  std::string prefix;  // the first characters, for listings
};

class Authenticator {
 public:
  // `admin_token` empty = no admin access at all.
  Authenticator(db::Pool* pool, std::string admin_token)
      : pool_(pool), admin_token_(std::move(admin_token)) {}

  // `authorization` is the header value, "Bearer <token>". UNAUTHENTICATED, with the same
  // message for a missing, malformed, unknown, revoked or expired token.
  absl::StatusOr<Principal> Authenticate(const std::string& authorization) const;

  // INVALID_ARGUMENT for a name that is not [a-z][a-z0-9-]{0,62}; ALREADY_EXISTS when taken.
  absl::StatusOr<int64_t> CreateTenant(const std::string& name, const std::string& display_name);
  // A token for tenant `name` (NOT_FOUND when there is none).
  absl::StatusOr<NewToken> CreateTenantToken(const std::string& name, const std::string& description);
  absl::StatusOr<NewToken> CreateNodeToken(const std::string& description);
  // Sorted by name, names after `after`.
  absl::StatusOr<std::vector<TenantRecord>> ListTenants(const std::string& after, int32_t limit);
  // Idempotent; NOT_FOUND unless token `id` belongs to `tenant` ("" = a node token).
  absl::StatusOr<TokenRecord> RevokeToken(const std::string& tenant, int64_t id);

 private:
  absl::StatusOr<NewToken> StoreToken(std::optional<int64_t> tenant_id, const char* kind,
                                      const std::string& description);

  db::Pool* pool_;
  std::string admin_token_;
};

}  // namespace gradhub::api
