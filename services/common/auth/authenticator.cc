#include "services/common/auth/authenticator.h"

#include <openssl/crypto.h>
#include <openssl/rand.h>

#include <regex>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "services/common/db/error.h"
#include "services/common/sha256.h"
#include "services/common/status_macros.h"
#include "services/common/text_rules.h"

namespace gradhub::api {
namespace {

constexpr char kBearer[] = "Bearer ";
constexpr char kTokenPrefix[] = "ghk_";
constexpr char kJobTokenPrefix[] = "ghj_";
constexpr size_t kListedPrefix = 10;  // "ghk_" and 6 hex characters

absl::Status Unauthenticated() {
  return absl::UnauthenticatedError("missing or invalid bearer token");
}

bool ConstantTimeEquals(const std::string& a, const std::string& b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace

absl::StatusOr<Principal> Authenticator::Authenticate(const std::string& authorization) const {
  if (authorization.rfind(kBearer, 0) != 0) return Unauthenticated();
  const std::string token = authorization.substr(sizeof(kBearer) - 1);
  if (token.empty()) return Unauthenticated();
  if (!admin_token_.empty() && ConstantTimeEquals(token, admin_token_)) {
    return Principal{Principal::Kind::kAdmin, 0, ""};
  }
  const std::string digest = Sha256Hex(token);
  const absl::Time now = absl::Now();
  {
    absl::MutexLock lock(&cache_mutex_);
    if (auto hit = cache_.find(digest); hit != cache_.end() && hit->second.expires > now) {
      return hit->second.principal;
    }
  }
  GRADHUB_ASSIGN_OR_RETURN(const Principal principal, LookUpToken(digest));
  if (principal.kind == Principal::Kind::kJob) return principal;  // never cached
  // Bounded by the callers' distinct tokens; a flood of them only costs a refill.
  constexpr size_t kMaxCachedTokens = 10000;
  absl::MutexLock lock(&cache_mutex_);
  if (cache_.size() >= kMaxCachedTokens) cache_.clear();
  cache_[digest] = CachedPrincipal{principal, now + kTokenCacheTtl};
  return principal;
}

absl::StatusOr<Principal> Authenticator::LookUpToken(const std::string& digest) const {
  // A job token lives while its attempt is the job's current one and the job has not ended
  // (RESTARTING and CANCELLING included: a stopping rank 0 may still save its last step).
  GRADHUB_ASSIGN_OR_RETURN(
      db::Result rows,
      pool_->Exec("SELECT k.id, k.kind, coalesce(k.tenant_id, j.tenant_id, 0) AS tenant_id,"
                  " coalesce(t.name, jt.name, '') AS tenant_name,"
                  " coalesce(k.job_id::text, '') AS job_id, coalesce(k.attempt, 0) AS attempt,"
                  " coalesce(k.rank, 0) AS rank"
                  " FROM api_tokens k LEFT JOIN tenants t ON t.id = k.tenant_id"
                  " LEFT JOIN jobs j ON j.id = k.job_id"
                  " LEFT JOIN tenants jt ON jt.id = j.tenant_id"
                  " WHERE k.secret_sha256 = decode($1, 'hex') AND k.revoke_time IS NULL"
                  " AND (k.expire_time IS NULL OR k.expire_time > now())"
                  " AND (k.kind <> 'JOB' OR (j.current_attempt = k.attempt"
                  "  AND j.state IN ('SCHEDULED', 'RUNNING', 'RESTARTING', 'CANCELLING')))",
                  {digest}));
  if (rows.empty()) return Unauthenticated();
  const db::Row row = rows.row(0);
  const std::string kind = row.Get<std::string>("kind");
  Principal principal;
  principal.kind = kind == "NODE"  ? Principal::Kind::kNode
                   : kind == "JOB" ? Principal::Kind::kJob
                                   : Principal::Kind::kTenant;
  principal.token_id = row.Get<int64_t>("id");
  if (principal.kind == Principal::Kind::kNode) return principal;
  principal.tenant_id = row.Get<int64_t>("tenant_id");
  principal.tenant_name = row.Get<std::string>("tenant_name");
  if (principal.kind == Principal::Kind::kJob) {
    principal.job_id = row.Get<std::string>("job_id");
    principal.attempt = static_cast<int32_t>(row.Get<int64_t>("attempt"));
    principal.rank = static_cast<int32_t>(row.Get<int64_t>("rank"));
  }
  return principal;
}

absl::Status Authenticator::RequireAdmin(const std::string& authorization) const {
  GRADHUB_ASSIGN_OR_RETURN(const Principal principal, Authenticate(authorization));
  if (principal.kind != Principal::Kind::kAdmin) {
    return absl::PermissionDeniedError("this call takes the admin token");
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> Authenticator::JobTenant(const std::string& authorization,
                                                 JobAccess access) const {
  GRADHUB_ASSIGN_OR_RETURN(const Principal principal, Authenticate(authorization));
  if (principal.kind == Principal::Kind::kAdmin && access == JobAccess::kReadOrCancel) {
    return kAnyTenant;
  }
  if (principal.kind != Principal::Kind::kTenant) {
    return absl::PermissionDeniedError("jobs belong to tenants: use a tenant token");
  }
  return principal.tenant_id;
}

absl::StatusOr<int64_t> Authenticator::CreateTenant(const std::string& name,
                                                    const std::string& display_name,
                                                    const std::string& request_id) {
  static const std::regex kName("[a-z][a-z0-9-]{0,62}");
  if (!std::regex_match(name, kName)) {
    return absl::InvalidArgumentError(
        absl::StrCat("name: '", name, "' must match [a-z][a-z0-9-]{0,62}"));
  }
  if (std::string problem = TextLimitProblem(request_id, 64); !problem.empty()) {
    return absl::InvalidArgumentError("request_id: " + problem);
  }
  if (std::string problem = TextProblem(display_name); !problem.empty()) {
    return absl::InvalidArgumentError("display_name: " + problem);
  }
  // A name taken by a call with the same request_id: that call's tenant (the no-op update makes
  // RETURNING give its row); taken otherwise: no row.
  auto rows = pool_->Exec(
      "INSERT INTO tenants (name, display_name, request_id) VALUES ($1, $2, NULLIF($3, ''))"
      " ON CONFLICT (name) DO UPDATE SET request_id = tenants.request_id"
      " WHERE tenants.request_id = NULLIF($3, '')"
      " RETURNING id",
      {name, display_name, request_id});
  if (!rows.ok()) return rows.status();
  if (rows->empty()) return absl::AlreadyExistsError(absl::StrCat("tenant '", name, "' exists"));
  return rows->row(0).Get<int64_t>("id");
}

absl::StatusOr<NewToken> Authenticator::CreateTenantToken(const std::string& name,
                                                          const std::string& description) {
  GRADHUB_ASSIGN_OR_RETURN(db::Result rows,
                           pool_->Exec("SELECT id FROM tenants WHERE name = $1", {name}));
  if (rows.empty()) return absl::NotFoundError(absl::StrCat("tenant '", name, "' not found"));
  return StoreToken({"TENANT", rows.row(0).Get<int64_t>("id")}, description);
}

absl::StatusOr<NewToken> Authenticator::CreateNodeToken(const std::string& description) {
  return StoreToken({"NODE", std::nullopt}, description);
}

absl::StatusOr<NewToken> Authenticator::CreateJobToken(const std::string& job_id, int32_t attempt,
                                                       int32_t rank) const {
  return StoreToken({"JOB", std::nullopt, job_id, attempt, rank},
                    absl::StrCat("rank ", rank, " of attempt ", attempt));
}

absl::StatusOr<NewToken> Authenticator::StoreToken(const TokenOwner& owner,
                                                   const std::string& description) const {
  unsigned char random[32];
  if (RAND_bytes(random, sizeof(random)) != 1) {
    return absl::InternalError("no randomness for a token (RAND_bytes failed)");
  }
  NewToken token;
  const bool job = std::string(owner.kind) == "JOB";
  token.secret =
      (job ? kJobTokenPrefix : kTokenPrefix) +
      absl::BytesToHexString(std::string(reinterpret_cast<char*>(random), sizeof(random)));
  token.prefix = token.secret.substr(0, kListedPrefix);
  GRADHUB_ASSIGN_OR_RETURN(
      db::Result rows,
      pool_->Exec("INSERT INTO api_tokens"
                  " (tenant_id, kind, secret_sha256, prefix, description, job_id, attempt, rank)"
                  " VALUES ($1, $2, decode($3, 'hex'), $4, $5, $6::uuid, $7, $8) RETURNING id",
                  {owner.tenant_id ? db::Param(*owner.tenant_id) : db::Param(std::nullopt),
                   owner.kind, Sha256Hex(token.secret), token.prefix, description,
                   job ? db::Param(owner.job_id) : db::Param(std::nullopt),
                   job ? db::Param(owner.attempt) : db::Param(std::nullopt),
                   job ? db::Param(owner.rank) : db::Param(std::nullopt)}));
  token.id = rows.row(0).Get<int64_t>("id");
  return token;
}

absl::StatusOr<std::vector<TenantRecord>> Authenticator::ListTenants(const std::string& after,
                                                                     int32_t limit) {
  GRADHUB_ASSIGN_OR_RETURN(
      db::Result rows, pool_->Exec("SELECT name, display_name,"
                                   " (extract(epoch FROM create_time) * 1e6)::bigint AS create_us"
                                   " FROM tenants WHERE name > $1 ORDER BY name LIMIT $2",
                                   {after, limit}));
  std::vector<TenantRecord> tenants;
  for (const db::Row& row : rows) {
    tenants.push_back({row.Get<std::string>("name"), row.Get<std::string>("display_name"),
                       row.Get<int64_t>("create_us")});
  }
  return tenants;
}

absl::StatusOr<TokenRecord> Authenticator::RevokeToken(const std::string& tenant, int64_t id) {
  GRADHUB_ASSIGN_OR_RETURN(
      db::Result rows,
      pool_->Exec("UPDATE api_tokens SET revoke_time = coalesce(revoke_time, now())"
                  " WHERE id = $1 AND ((kind = 'NODE' AND $2 = '')"
                  "   OR tenant_id = (SELECT id FROM tenants WHERE name = $2))"
                  " RETURNING kind, prefix, description,"
                  " (SELECT name FROM tenants WHERE tenants.id = api_tokens.tenant_id) AS tenant,"
                  " (extract(epoch FROM create_time) * 1e6)::bigint AS create_us,"
                  " (extract(epoch FROM revoke_time) * 1e6)::bigint AS revoke_us",
                  {id, tenant}));
  if (rows.empty()) return absl::NotFoundError(absl::StrCat("token ", id, " not found"));
  {
    // Revoked here means refused here at once; other replicas follow within kTokenCacheTtl.
    absl::MutexLock lock(&cache_mutex_);
    cache_.clear();
  }
  const db::Row row = rows.row(0);
  return TokenRecord{id,
                     row.Get<std::optional<std::string>>("tenant").value_or(""),
                     row.Get<std::string>("kind"),
                     row.Get<std::string>("prefix"),
                     row.Get<std::string>("description"),
                     row.Get<int64_t>("create_us"),
                     row.Get<int64_t>("revoke_us")};
}

}  // namespace gradhub::api
