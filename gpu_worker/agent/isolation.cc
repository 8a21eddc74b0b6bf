#include "gpu_worker/agent/isolation.h"

#include <sys/stat.h>

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "gpu_worker/agent/config.h"
#include "services/common/contract/data_paths.h"
#include "services/common/contract/input_file.h"
#include "services/common/status_macros.h"

namespace gradhub::agent {
namespace {

constexpr int64_t kMaxMemoryPerRankMib = int64_t{1} << 24;  // 16 TiB, as jobs.proto says

// `root` made absolute and lexically clean, as jobs will spell paths under it; it must be a
// directory, and contain no ':' (the separator of GRADHUB_DATA_ROOTS). Errors name `flag`.
absl::StatusOr<std::string> CleanDirectory(const std::string& flag, const std::string& root) {
  std::error_code error;
  std::string path = std::filesystem::absolute(root, error).lexically_normal().string();
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  struct stat info;
  if (error || !IsCleanPath(path) || stat(path.c_str(), &info) != 0 || !S_ISDIR(info.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " ", root, ": not an existing directory"));
  }
  if (path.find(':') != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " ", root, ": may not contain ':'"));
  }
  return path;
}

absl::StatusOr<std::vector<std::string>> CleanDataRoots(const std::vector<std::string>& roots) {
  std::vector<std::string> clean;
  for (const std::string& root : roots) {
    GRADHUB_ASSIGN_OR_RETURN(std::string path, CleanDirectory("--data-root", root));
    clean.push_back(std::move(path));
  }
  return clean;
}

// Each --tenant-data-root parsed, its path cleaned, its gid given.
absl::StatusOr<std::vector<TenantRoot>> ParseTenantRoots(const AgentConfig& config) {
  std::vector<TenantRoot> roots;
  for (const std::string& flag : config.tenant_data_roots) {
    GRADHUB_ASSIGN_OR_RETURN(TenantRoot root, ParseTenantRootFlag(flag));
    GRADHUB_ASSIGN_OR_RETURN(root.path, CleanDirectory("--tenant-data-root", root.path));
    root.gid = TenantGid(root.tenant, config.tenant_gid_base, config.tenant_gid_count);
    roots.push_back(std::move(root));
  }
  return roots;
}

std::string Resolved(const std::string& path) {
  std::error_code error;
  const std::filesystem::path real = std::filesystem::canonical(path, error);
  return error ? path : real.string();
}

// CheckRootsApart on the paths as written, then on their real paths (a root may be a symlink
// into another's directory).
absl::Status CheckApartAsWrittenAndResolved(const std::vector<std::string>& shared,
                                            std::vector<TenantRoot> tenant_roots) {
  GRADHUB_RETURN_IF_ERROR(CheckRootsApart(shared, tenant_roots));
  std::vector<std::string> shared_real;
  for (const std::string& root : shared) shared_real.push_back(Resolved(root));
  for (TenantRoot& root : tenant_roots) root.path = Resolved(root.path);
  return CheckRootsApart(shared_real, tenant_roots);
}

// Tenant roots, in the order of tenant_roots.h: without root, only where no script rank runs
// (path checks alone cannot hold tenant code); the gid range; each root; gids distinct; roots
// apart; each enterable by a rank (any uid of the job range with the rank group); restricted.
absl::Status SetUpTenantRoots(const AgentConfig& config, NodeIsolation* isolation) {
  if (config.tenant_data_roots.empty()) return absl::OkStatus();
  const RankIdentity& identity = isolation->identity;
  if (!identity.switch_user && config.master_port_base != 0) {
    return absl::InvalidArgumentError(
        "--tenant-data-root: only an agent running as root keeps script ranks (tenant code) "
        "out of other tenants' roots; run it as root, or pass --master-port-base 0 (no script "
        "jobs on this node)");
  }
  GRADHUB_RETURN_IF_ERROR(CheckTenantGidRange(config.tenant_gid_base, config.tenant_gid_count,
                                              config.job_uid_base, config.job_uid_count,
                                              identity.gid));
  GRADHUB_ASSIGN_OR_RETURN(isolation->tenant_roots, ParseTenantRoots(config));
  GRADHUB_RETURN_IF_ERROR(CheckGidsDistinct(isolation->tenant_roots));
  GRADHUB_RETURN_IF_ERROR(
      CheckApartAsWrittenAndResolved(isolation->data_roots, isolation->tenant_roots));
  if (!identity.switch_user) return absl::OkStatus();
  for (const TenantRoot& root : isolation->tenant_roots) {
    std::string blocked;
    const std::string parent = std::filesystem::path(root.path).parent_path().string();
    if (!Traversable(parent, static_cast<uid_t>(config.job_uid_base), identity.gid, &blocked)) {
      return absl::InvalidArgumentError(absl::StrCat("--tenant-data-root ", root.tenant, "=",
                                                     root.path, ": ranks cannot enter ", blocked,
                                                     " (give it o+x)"));
    }
  }
  for (const TenantRoot& root : isolation->tenant_roots) {
    GRADHUB_RETURN_IF_ERROR(RestrictTenantRoot(root));
  }
  return absl::OkStatus();
}

// The mechanism is chosen even without a per-slot cap (as if there were one), so that a spec's
// memoryPerRankMib always has one: --memory-isolation none means no cap, and a job's own limit
// by RLIMIT_DATA, which needs nothing of the machine and can only hold back that job.
absl::Status SetUpMemory(const AgentConfig& config, NodeIsolation* isolation) {
  const bool no_cap = config.memory_isolation == "none" || config.memory_per_slot < 0;
  int64_t limit = config.memory_per_slot;
  if (limit == 0) limit = MachineMemoryBytes() / std::max<int64_t>(config.slots, 1);
  const CgroupProbe probe = ProbeCgroups(config.cgroup_parent);
  absl::StatusOr<MemoryMechanism> mechanism =
      ChooseMemoryMechanism(config.memory_isolation == "none" ? "rlimit" : config.memory_isolation,
                            std::max<int64_t>(limit, 1), probe);
  if (!mechanism.ok()) return mechanism.status();
  isolation->memory_limit_bytes = no_cap ? 0 : limit;
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

// --work-dir and --checkpoint-root: rank directories and the checkpoint cache are the rank
// user's, below these.
absl::Status CheckRankUserEnters(const AgentConfig& config, const RankIdentity& identity) {
  using FlagDir = std::pair<const char*, std::string>;
  for (const auto& [flag, dir] : {FlagDir{"--work-dir", config.work_dir},
                                  FlagDir{"--checkpoint-root", config.checkpoint_root}}) {
    std::string blocked;
    if (identity.switch_user && !dir.empty() &&
        !Traversable(dir, identity.uid, identity.gid, &blocked)) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, " ", dir, ": the ranks' user ", identity.name, " cannot enter ",
                       blocked, " (give it o+x, or choose another directory)"));
    }
  }
  return absl::OkStatus();
}

std::string DescribeMemory(const NodeIsolation& isolation) {
  if (isolation.memory_mechanism == MemoryMechanism::kNone) return "unlimited";
  return absl::StrCat(isolation.memory_limit_bytes > 0
                          ? absl::StrCat(isolation.memory_limit_bytes, " bytes")
                          : std::string("unlimited unless a job sets one"),
                      " by ", MemoryMechanismName(isolation.memory_mechanism),
                      isolation.cgroup_dir.empty() ? "" : " in " + isolation.cgroup_dir);
}

std::string DescribeTenantRoots(const NodeIsolation& isolation) {
  if (isolation.tenant_roots.empty()) return "none";
  std::string text;
  for (const TenantRoot& root : isolation.tenant_roots) {
    absl::StrAppend(&text, text.empty() ? "" : ", ", root.tenant, "=", root.path, " (gid ",
                    root.gid, ")");
  }
  return isolation.identity.switch_user ? text : text + " (checked by path only: not root)";
}

}  // namespace

absl::StatusOr<NodeIsolation> SetUpIsolation(const AgentConfig& config) {
  NodeIsolation isolation;
  GRADHUB_ASSIGN_OR_RETURN(isolation.identity, ResolveRankIdentity(config.run_as));
  GRADHUB_ASSIGN_OR_RETURN(isolation.data_roots, CleanDataRoots(config.data_roots));
  if (config.max_input_bytes <= 0) {
    return absl::InvalidArgumentError("--max-input-bytes: must be > 0");
  }
  isolation.max_input_bytes = config.max_input_bytes;
  GRADHUB_RETURN_IF_ERROR(CheckRankUserEnters(config, isolation.identity));
  GRADHUB_RETURN_IF_ERROR(SetUpTenantRoots(config, &isolation));
  // Last: it creates this agent's cgroup directory, which an error above would leave behind.
  GRADHUB_RETURN_IF_ERROR(SetUpMemory(config, &isolation));
  return isolation;
}

std::vector<std::string> RankDataRoots(const NodeIsolation& isolation, const std::string& tenant) {
  return RootsOfTenant(isolation.data_roots, isolation.tenant_roots, tenant);
}

absl::StatusOr<int64_t> RankMemoryLimit(const NodeIsolation& isolation, const v1::JobSpec& spec) {
  const int64_t mib = spec.memory_per_rank_mib();
  if (mib == 0) return isolation.memory_limit_bytes;
  if (mib < 0 || mib > kMaxMemoryPerRankMib) {
    return absl::InvalidArgumentError(
        absl::StrCat("memoryPerRankMib: ", mib, " is not in [0, ", kMaxMemoryPerRankMib, "]"));
  }
  const int64_t cap = isolation.memory_limit_bytes;
  if (isolation.memory_mechanism == MemoryMechanism::kNone) {  // not from SetUpIsolation
    return absl::InvalidArgumentError(
        absl::StrCat("memoryPerRankMib: ", mib, " MiB cannot be enforced on this node"));
  }
  if (cap > 0 && (mib << 20) > cap) {
    return absl::InvalidArgumentError(absl::StrCat("memoryPerRankMib: ", mib,
                                                   " MiB is more than this node's ", cap >> 20,
                                                   " MiB per slot (", cap, " bytes)"));
  }
  return mib << 20;
}

std::string CheckRankSpec(const NodeIsolation& isolation, const v1::RankAssignment& assignment) {
  InputPolicy policy;
  policy.enforce_roots = true;
  policy.data_roots = RankDataRoots(isolation, assignment.tenant());
  policy.max_bytes = isolation.max_input_bytes;
  std::string problems;
  for (const SpecPath& path : SpecPaths(assignment.spec())) {
    if (std::string problem = CheckInputPath(path.path, path.field, policy); !problem.empty()) {
      absl::StrAppend(&problems, problems.empty() ? "" : "; ", problem);
    }
  }
  if (absl::StatusOr<int64_t> limit = RankMemoryLimit(isolation, assignment.spec()); !limit.ok()) {
    absl::StrAppend(&problems, problems.empty() ? "" : "; ", limit.status().message());
  }
  return problems;
}

std::string DescribeIsolation(const NodeIsolation& isolation) {
  return absl::StrCat("ranks run as ", isolation.identity.name, " (uid ", isolation.identity.uid,
                      ")", "; data roots: ", DescribeRoots(isolation.data_roots),
                      "; tenant data roots: ", DescribeTenantRoots(isolation), "; files up to ",
                      isolation.max_input_bytes,
                      " bytes; memory per rank: ", DescribeMemory(isolation));
}

}  // namespace gradhub::agent
