// Which user a rank runs as. An agent is root only to do a root's work (cgroups, chown, killing
// leftovers): a root agent starts every rank as an unprivileged user (--run-as, default
// gradhub-rank, which `make setup` creates), never as root; an agent that is not root runs
// ranks as itself, and cannot do otherwise.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace gradhub::agent {

inline constexpr char kDefaultRankUser[] = "gradhub-rank";

struct UserRecord {
  std::string name;
  uid_t uid = 0;
  gid_t gid = 0;
};

struct RankIdentity {
  // False: ranks keep the agent's credentials (the agent is not root).
  bool switch_user = false;
  std::string name;
  uid_t uid = 0;
  gid_t gid = 0;  // the user's primary group; other groups are dropped, but for these
  std::vector<gid_t> supplementary_gids;  // never 0
};

// The decision, pure: `run_as` is the flag ("" = the default), `user` what the password
// database says of the name it resolves to (nullopt = no such user). INVALID_ARGUMENT naming
// --run-as for root (uid 0 or gid 0), an unknown user, or another user asked of a non-root
// agent.
absl::StatusOr<RankIdentity> DecideRankIdentity(uid_t agent_uid, const std::string& agent_name,
                                                const std::string& run_as,
                                                const std::optional<UserRecord>& user);

// The name DecideRankIdentity looks up for `run_as` when the agent is root.
std::string RankUserName(const std::string& run_as);

// getpwnam_r, then DecideRankIdentity for this process.
absl::StatusOr<RankIdentity> ResolveRankIdentity(const std::string& run_as);

// True when `uid`/`gid` may enter each directory on the way to `path` (a search bit for
// them on every ancestor); else the first ancestor that stops them, in *blocked.
bool Traversable(const std::string& path, uid_t uid, gid_t gid, std::string* blocked);

}  // namespace gradhub::agent
