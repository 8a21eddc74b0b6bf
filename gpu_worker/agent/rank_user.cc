#include "gpu_worker/agent/rank_user.h"

#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <vector>

#include "absl/strings/str_cat.h"

namespace gradhub::agent {

std::string RankUserName(const std::string& run_as) {
  return run_as.empty() ? kDefaultRankUser : run_as;
}

absl::StatusOr<RankIdentity> DecideRankIdentity(uid_t agent_uid, const std::string& agent_name,
                                                const std::string& run_as,
                                                const std::optional<UserRecord>& user) {
  if (run_as == "root") return absl::InvalidArgumentError("--run-as: ranks never run as root");
  RankIdentity self;
  self.name = agent_name;
  self.uid = agent_uid;
  if (agent_uid != 0) {
    // Not root: it cannot change user, and need not (its ranks are as unprivileged as it is).
    if (run_as.empty() || run_as == agent_name) return self;
    return absl::InvalidArgumentError(
        absl::StrCat("--run-as ", run_as,
                     ": only an agent running as root can start ranks as another "
                     "user; this one runs as ",
                     agent_name, " (uid ", agent_uid, "), leave --run-as unset"));
  }
  const std::string name = RankUserName(run_as);
  if (!user.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--run-as: there is no user '", name, "' on this node (`make setup` creates ",
                     kDefaultRankUser, "; or name another unprivileged user)"));
  }
  if (user->uid == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--run-as ", name, ": has uid 0; ranks never run as root"));
  }
  if (user->gid == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--run-as ", name, ": its group is root (gid 0); ranks never run with it"));
  }
  RankIdentity identity;
  identity.switch_user = true;
  identity.name = user->name;
  identity.uid = user->uid;
  identity.gid = user->gid;
  return identity;
}

namespace {

std::optional<UserRecord> LookUpUser(const std::string& name) {
  struct passwd entry, *result = nullptr;
  std::vector<char> buffer(16384);
  if (getpwnam_r(name.c_str(), &entry, buffer.data(), buffer.size(), &result) != 0 ||
      result == nullptr) {
    return std::nullopt;
  }
  return UserRecord{entry.pw_name, entry.pw_uid, entry.pw_gid};
}

std::string NameOf(uid_t uid) {
  struct passwd entry, *result = nullptr;
  std::vector<char> buffer(16384);
  if (getpwuid_r(uid, &entry, buffer.data(), buffer.size(), &result) != 0 || result == nullptr) {
    return std::to_string(uid);
  }
  return entry.pw_name;
}

}  // namespace

absl::StatusOr<RankIdentity> ResolveRankIdentity(const std::string& run_as) {
  const uid_t self = geteuid();
  const std::optional<UserRecord> user =
      self == 0 && run_as != "root" ? LookUpUser(RankUserName(run_as)) : std::nullopt;
  return DecideRankIdentity(self, NameOf(self), run_as, user);
}

bool Traversable(const std::string& path, uid_t uid, gid_t gid, std::string* blocked) {
  std::filesystem::path current;
  for (const auto& part : std::filesystem::path(path)) {
    current /= part;
    struct stat info;
    if (stat(current.c_str(), &info) != 0) continue;  // not created yet: the agent makes it
    const mode_t bit = info.st_uid == uid ? S_IXUSR : info.st_gid == gid ? S_IXGRP : S_IXOTH;
    if (S_ISDIR(info.st_mode) && (info.st_mode & bit) == 0) {
      *blocked = current.string();
      return false;
    }
  }
  return true;
}

}  // namespace gradhub::agent
