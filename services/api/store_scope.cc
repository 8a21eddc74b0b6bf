#include "services/api/store_scope.h"

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"

namespace gradhub::api {

std::string AttemptKeyPrefix(absl::string_view job_id, int32_t attempt) {
  return absl::StrCat("jobs/", job_id, "/attempts/", attempt, "/");
}

absl::StatusOr<std::string> StoreScopeOf(const Principal& principal) {
  switch (principal.kind) {
    case Principal::Kind::kAdmin:
      return std::string(kAnyKey);
    case Principal::Kind::kJob:
      // An empty job id would make the scope "jobs//attempts/..."; refuse rather than guess.
      if (principal.job_id.empty() || principal.attempt <= 0) {
        return absl::PermissionDeniedError("this job token names no job attempt");
      }
      return AttemptKeyPrefix(principal.job_id, principal.attempt);
    case Principal::Kind::kNode:
    case Principal::Kind::kTenant:
      break;
  }
  return absl::PermissionDeniedError(
      "the rendezvous store takes a rank's job token or the admin token, not a tenant's or a "
      "node's");
}

absl::StatusOr<std::string> AuthorizeStoreCall(const Authenticator& auth,
                                               const std::string& authorization) {
  absl::StatusOr<Principal> caller = auth.Authenticate(authorization);
  if (!caller.ok()) return caller.status();
  return StoreScopeOf(*caller);
}

absl::Status CheckKeyInScope(absl::string_view scope, absl::string_view field,
                             absl::string_view key) {
  if (absl::StartsWith(key, scope)) return absl::OkStatus();
  // Cut: the key is the caller's and not yet checked for length (the store does that later).
  constexpr size_t kMaxShown = 160;
  return absl::PermissionDeniedError(
      absl::StrCat(field, ": \"", absl::CHexEscape(key.substr(0, kMaxShown)),
                   key.size() > kMaxShown ? "..." : "",
                   "\" is outside this token's keys: it may touch only ", scope, "..."));
}

}  // namespace gradhub::api
