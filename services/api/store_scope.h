// Which keys of the rendezvous store a caller may touch: the rule StoreService applies to every
// call, as pure functions of the caller's Principal and the call's keys (no database, no gRPC),
// each with a test of its own (tests/unit/api/store_scope_test.cc).
//
// Every rank, trainer or script, calls with its job token, and a script rank runs tenant code,
// so the store treats each as a possible attacker of every other job: it may touch its own
// attempt's keys and nothing else.
//   1. The admin token may touch any key: the scope is "" (kAnyKey).
//   2. A job token is confined to its attempt: "jobs/{job_id}/attempts/{attempt}/". Keys of
//      another job, of another attempt of its own job, or outside "jobs/" are refused, so a
//      rank can neither read, forge, wait on nor delete another rendezvous.
//   3. A tenant token gets no store access at all (tenants submit jobs; their ranks
//      rendezvous), and neither does a node token (agents never rendezvous; their ranks have
//      job tokens of their own).
//   4. Every key of a call must start with the scope: `key` (Set, Get, Add), each of `keys`
//      (Wait, Check), `prefix` (DeletePrefix). One key outside refuses the whole call, before it
//      touches the store: PERMISSION_DENIED naming the field and the key.
// The job token's own life (its attempt current, its job not ended) is the Authenticator's
// rule: a token of an ended attempt never gets as far as a Principal.
//
// Thread-safe: plain functions of their arguments.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "services/common/auth/authenticator.h"

namespace gradhub::api {

// The scope of a caller who may touch every key (rule 1).
inline constexpr absl::string_view kAnyKey = "";

// "jobs/{job_id}/attempts/{attempt}/": the keys of one attempt, as the scheduler names its
// rendezvous_prefix. The trailing slash keeps attempt 1 off attempt 10's keys.
std::string AttemptKeyPrefix(absl::string_view job_id, int32_t attempt);

// The key prefix `principal` is confined to (rules 1 to 3); PERMISSION_DENIED for a tenant's
// or a node's token, and for a job token that names no job or attempt.
absl::StatusOr<std::string> StoreScopeOf(const Principal& principal);

// StoreService's Authorizer in gradhub-api: the caller's token through `auth`, then
// StoreScopeOf. A job token is never cached (it ends with its attempt), so for a script rank
// every store call costs this one database lookup (Authenticator::LookUpToken); StoreService
// runs it off its queue thread. An ended attempt's token is UNAUTHENTICATED here.
absl::StatusOr<std::string> AuthorizeStoreCall(const Authenticator& auth,
                                               const std::string& authorization);

// OK when `key` starts with `scope` (rule 4); else PERMISSION_DENIED naming `field` and the key.
absl::Status CheckKeyInScope(absl::string_view scope, absl::string_view field,
                             absl::string_view key);

// CheckKeyInScope for each of `keys` (any range of strings), naming the first outside as
// field[i].
template <typename Keys>
absl::Status CheckKeysInScope(absl::string_view scope, absl::string_view field, const Keys& keys) {
  if (scope.empty()) return absl::OkStatus();
  size_t i = 0;
  for (const auto& key : keys) {
    if (!absl::StartsWith(key, scope)) {
      return CheckKeyInScope(scope, absl::StrCat(field, "[", i, "]"), key);
    }
    ++i;
  }
  return absl::OkStatus();
}

}  // namespace gradhub::api
