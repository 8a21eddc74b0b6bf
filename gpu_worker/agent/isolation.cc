#include "gpu_worker/agent/isolation.h"

#include <sys/stat.h>

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "gpu_worker/agent/config.h"
#include "services/common/contract/data_paths.h"
#include "services/common/contract/input_file.h"

namespace gradhub::agent {
namespace {

// Absolute and lexically clean, as jobs will spell paths under them; each must be a directory.
absl::StatusOr<std::vector<std::string>> CleanDataRoots(const std::vector<std::string>& roots) {
  std::vector<std::string> clean;
  for (const std::string& root : roots) {
    std::error_code error;
    std::string path = std::filesystem::absolute(root, error).lexically_normal().string();
    while (path.size() > 1 && path.back() == '/') path.pop_back();
    struct stat info;
    if (error || !IsCleanPath(path) || stat(path.c_str(), &info) != 0 || !S_ISDIR(info.st_mode)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--data-root ", root, ": not an existing directory"));
    }
    if (path.find(':') != std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("--data-root ", root, ": may not contain ':'"));
    }
    clean.push_back(path);
  }
  return clean;
}

absl::Status SetUpMemory(const AgentConfig& config, NodeIsolation* isolation) {
  int64_t limit = config.memory_per_slot;
  if (limit == 0) limit = MachineMemoryBytes() / std::max<int64_t>(config.slots, 1);
  if (limit < 0) limit = 0;
  const CgroupProbe probe = ProbeCgroups(config.cgroup_parent);
  absl::StatusOr<MemoryMechanism> mechanism =
      ChooseMemoryMechanism(config.memory_isolation, limit, probe);
  if (!mechanism.ok()) return mechanism.status();
  isolation->memory_limit_bytes = *mechanism == MemoryMechanism::kNone ? 0 : limit;
  isolation->memory_mechanism = *mechanism;
  if (*mechanism == MemoryMechanism::kCgroupV1 || *mechanism == MemoryMechanism::kCgroupV2) {
    const std::string& parent =
        *mechanism == MemoryMechanism::kCgroupV2 ? probe.v2_parent : probe.v1_parent;
    absl::StatusOr<std::string> dir =
        PrepareAgentCgroup(*mechanism, parent, AgentCgroupName(config.name, config.work_dir));
    if (!dir.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--memory-isolation ", MemoryMechanismName(*mechanism), ": ", dir.status().message()));
    }
    isolation->cgroup_dir = *dir;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<NodeIsolation> SetUpIsolation(const AgentConfig& config) {
  NodeIsolation isolation;
  absl::StatusOr<RankIdentity> identity = ResolveRankIdentity(config.run_as);
  if (!identity.ok()) return identity.status();
  isolation.identity = *identity;
  absl::StatusOr<std::vector<std::string>> roots = CleanDataRoots(config.data_roots);
  if (!roots.ok()) return roots.status();
  isolation.data_roots = *roots;
  if (config.max_input_bytes <= 0) {
    return absl::InvalidArgumentError("--max-input-bytes: must be > 0");
  }
  isolation.max_input_bytes = config.max_input_bytes;
  // Rank directories and the checkpoint cache are the rank user's, below these.
  using FlagDir = std::pair<const char*, std::string>;
  for (const auto& [flag, dir] : {FlagDir{"--work-dir", config.work_dir},
                                  FlagDir{"--checkpoint-root", config.checkpoint_root}}) {
    std::string blocked;
    if (isolation.identity.switch_user && !dir.empty() &&
        !Traversable(dir, isolation.identity.uid, isolation.identity.gid, &blocked)) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, " ", dir, ": the ranks' user ", isolation.identity.name,
                       " cannot enter ", blocked, " (give it o+x, or choose another directory)"));
    }
  }
  // Last: it creates this agent's cgroup directory, which an error above would leave behind.
  if (absl::Status memory = SetUpMemory(config, &isolation); !memory.ok()) return memory;
  return isolation;
}

std::string CheckSpecInputs(const NodeIsolation& isolation, const v1::JobSpec& spec) {
  InputPolicy policy;
  policy.enforce_roots = true;
  policy.data_roots = isolation.data_roots;
  policy.max_bytes = isolation.max_input_bytes;
  std::string problems;
  for (const SpecPath& path : SpecPaths(spec)) {
    if (std::string problem = CheckInputPath(path.path, path.field, policy); !problem.empty()) {
      absl::StrAppend(&problems, problems.empty() ? "" : "; ", problem);
    }
  }
  return problems;
}

std::string DescribeIsolation(const NodeIsolation& isolation) {
  return absl::StrCat(
      "ranks run as ", isolation.identity.name, " (uid ", isolation.identity.uid, ")",
      "; data roots: ", DescribeRoots(isolation.data_roots), "; files up to ",
      isolation.max_input_bytes, " bytes; memory per rank: ",
      isolation.memory_limit_bytes > 0
          ? absl::StrCat(isolation.memory_limit_bytes, " bytes by ",
                         MemoryMechanismName(isolation.memory_mechanism),
                         isolation.cgroup_dir.empty() ? "" : " in " + isolation.cgroup_dir)
          : std::string("unlimited"));
}

}  // namespace gradhub::agent
