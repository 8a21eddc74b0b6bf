// Bearer tokens: tenants and their tokens, node tokens for agents, and the admin token that
// bootstraps both. Only the SHA-256 of a token is stored, so a copy of the database does not
// let anyone in; the secret is shown once, when it is created.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "services/common/db/pool.h"

namespace gradhub::api {

struct Principal {
  enum class Kind { kAdmin, kTenant, kNode };
  Kind kind = Kind::kTenant;
  int64_t tenant_id = 0;    // kTenant only
  std::string tenant_name;  // kTenant only
};

struct NewToken {
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

 private:
  absl::StatusOr<NewToken> StoreToken(std::optional<int64_t> tenant_id, const char* kind,
                                      const std::string& description);

  db::Pool* pool_;
  std::string admin_token_;
};

}  // namespace gradhub::api
