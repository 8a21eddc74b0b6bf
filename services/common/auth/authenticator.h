// Bearer tokens: tenants and their tokens, node tokens for agents, and the admin token that
// bootstraps both. Only the SHA-256 of a token is stored, so a copy of the database does not
// let anyone in; the secret is shown once, when it is created.
//
// Shared by the three services (api, checkpoint, metrics): each checks the same tokens against
// the api's tables. The namespace stays gradhub::api, the owner of those tables.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "services/common/db/pool.h"

namespace gradhub::api {

struct Principal {
  // kJob: a rank's credential, trainer or script (NodeService.IssueRankCredential), which acts
  // only on one job, attempt and rank, and only while `attempt` is that job's current attempt
  // and the job has not ended.
  enum class Kind { kAdmin, kTenant, kNode, kJob };
  Kind kind = Kind::kTenant;
  int64_t tenant_id = 0;    // kTenant; kJob: the job's tenant
  std::string tenant_name;  // kTenant; kJob: the job's tenant
  std::string job_id;       // kJob only: the uuid
  int32_t attempt = 0;      // kJob only
  int32_t rank = 0;         // kJob only
  int64_t token_id = 0;     // the api_tokens row (kTenant, kNode, kJob): the audit log's actor
};

struct TenantRecord {
  std::string name, display_name;
  int64_t create_us = 0;
};

struct TokenRecord {
  int64_t id = 0;
  std::string tenant;  // empty for node and job tokens
  std::string kind;    // "TENANT", "NODE" or "JOB"
  std::string prefix, description;
  int64_t create_us = 0, revoke_us = 0;
};

struct NewToken {
  int64_t id = 0;
  std::string secret;  // "ghk_" + 64 hex characters; never stored
  std::string prefix;  // the first characters, for listings
};

// Reads by the admin token see every tenant's jobs; JobManager takes it as a tenant id.
inline constexpr int64_t kAnyTenant = -1;

// What a caller wants to do with jobs: only a tenant creates them (they need an owner); the
// admin token also reads, watches and cancels every tenant's.
enum class JobAccess { kCreate, kReadOrCancel };

// Thread-safe: every method may be called from any thread at once (gRPC's and the REST
// gateway's request threads). The token cache has its own lock, held only to look up or insert;
// the database calls run outside it, each on its own pooled connection.
class Authenticator {
 public:
  // `admin_token` empty = no admin access at all.
  Authenticator(db::Pool* pool, std::string admin_token)
      : pool_(pool), admin_token_(std::move(admin_token)) {}

  // A token found in the database is trusted this long without asking it again, so a call costs
  // no query; a revocation through another api replica takes effect within this time. Job
  // tokens are never cached: they end with their attempt, which any replica may end.
  static constexpr absl::Duration kTokenCacheTtl = absl::Seconds(5);

  // `authorization` is the header value, "Bearer <token>". UNAUTHENTICATED, with the same
  // message for a missing, malformed, unknown, revoked or expired token.
  absl::StatusOr<Principal> Authenticate(const std::string& authorization) const;

  // OK for the admin token alone: what the operators' calls take (AdminService, NodeService's
  // node commands), over gRPC and REST alike. PERMISSION_DENIED for any other token.
  absl::Status RequireAdmin(const std::string& authorization) const;

  // The tenant whose jobs the caller may act on (kAnyTenant for the admin token, when `access`
  // allows it), or UNAUTHENTICATED / PERMISSION_DENIED: the one rule both adapters apply.
  absl::StatusOr<int64_t> JobTenant(const std::string& authorization, JobAccess access) const;

  // INVALID_ARGUMENT for a name that is not [a-z][a-z0-9-]{0,62}; ALREADY_EXISTS when taken,
  // except by an earlier call with the same non-empty `request_id`, whose tenant it returns.
  absl::StatusOr<int64_t> CreateTenant(const std::string& name, const std::string& display_name,
                                       const std::string& request_id = "");
  // A token for tenant `name` (NOT_FOUND when there is none).
  absl::StatusOr<NewToken> CreateTenantToken(const std::string& name,
                                             const std::string& description);
  absl::StatusOr<NewToken> CreateNodeToken(const std::string& description);
  // A job token ("ghj_..."), for rank `rank` of attempt `attempt` of job `job_id` (a uuid).
  // The caller (NodeManager) has checked that the rank is placed on the asking node.
  absl::StatusOr<NewToken> CreateJobToken(const std::string& job_id, int32_t attempt,
                                          int32_t rank) const;
  // Sorted by name, names after `after`.
  absl::StatusOr<std::vector<TenantRecord>> ListTenants(const std::string& after, int32_t limit);
  // Idempotent; NOT_FOUND unless token `id` belongs to `tenant` ("" = a node token).
  absl::StatusOr<TokenRecord> RevokeToken(const std::string& tenant, int64_t id);

 private:
  struct TokenOwner {
    const char* kind = "TENANT";  // "TENANT", "NODE" or "JOB"
    std::optional<int64_t> tenant_id;
    std::string job_id;  // JOB only, with attempt and rank
    int32_t attempt = 0, rank = 0;
  };
  absl::StatusOr<NewToken> StoreToken(const TokenOwner& owner,
                                      const std::string& description) const;
  absl::StatusOr<Principal> LookUpToken(const std::string& digest) const;

  db::Pool* pool_;
  std::string admin_token_;

  struct CachedPrincipal {
    Principal principal;
    absl::Time expires;
  };
  mutable absl::Mutex cache_mutex_;
  // By SHA-256 of the token; only tokens the database accepted.
  mutable std::unordered_map<std::string, CachedPrincipal> cache_ ABSL_GUARDED_BY(cache_mutex_);
};

}  // namespace gradhub::api
