// What keeps a node's tenants apart, as the agent applies it to every rank (docs/architecture.md,
// "Isolation of tenants on a node"):
//   - the rank's user (rank_user.h): never root;
//   - the data roots: every path a spec names must lie under one the rank may read (data_paths.h):
//     the shared --data-root directories and its own tenant's (tenant_roots.h), checked by the
//     agent before it starts the rank (CheckRankSpec) and by the trainer on the file it opens
//     (input_file.h), which gets those roots and the size cap through its environment; a root
//     agent also closes each tenant root to every other tenant's ranks (tenant_roots.h);
//   - a memory limit per rank (RankMemoryLimit): the spec's memoryPerRankMib, at most a slot's
//     share of the node, else that share (memory_limit.h).
// main builds it once from the flags (SetUpIsolation); the agent only reads it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "gpu_worker/agent/memory_limit.h"
#include "gpu_worker/agent/rank_user.h"
#include "gpu_worker/agent/tenant_roots.h"
#include "gradhub/v1/jobs.pb.h"
#include "gradhub/v1/nodes.pb.h"

namespace gradhub::agent {

struct AgentConfig;

struct NodeIsolation {
  RankIdentity identity;
  // Absolute and resolved (realpath), in flag order.
  std::vector<std::string> data_roots;
  // Absolute and clean, each with its tenant's gid, in flag order (tenant_roots.h).
  std::vector<TenantRoot> tenant_roots;
  int64_t max_input_bytes = 0;
  // A slot's share, the most a rank may have; 0 = no cap.
  int64_t memory_limit_bytes = 0;
  // How a rank's limit is enforced. Chosen even without a cap, so that a spec's
  // memoryPerRankMib is always applied (with --memory-isolation none: RLIMIT_DATA, no cap).
  MemoryMechanism memory_mechanism = MemoryMechanism::kNone;
  // With a cgroup mechanism: this agent's directory of rank cgroups.
  std::string cgroup_dir;
};

// The isolation `config` asks for on this machine, or INVALID_ARGUMENT naming the flag:
// --run-as (rank_user.h), --data-root (each must be an existing directory; its path may not
// contain ':', the separator of GRADHUB_DATA_ROOTS), --tenant-data-root (the same, and the
// rules of tenant_roots.h: roots of different owners apart, gids distinct and in a range of
// their own, every ancestor enterable by a rank; only a root agent may run script jobs with
// them), --max-input-bytes (> 0), --memory-per-slot (0 = this machine's memory divided by
// --slots, < 0 = no limit), --memory-isolation and --cgroup-parent (memory_limit.h), and
// --work-dir and --checkpoint-root, which the rank's user must be able to enter. Once every
// check passed, a root agent restricts the tenant roots (RestrictTenantRoot).
absl::StatusOr<NodeIsolation> SetUpIsolation(const AgentConfig& config);

// The roots a rank of `tenant` (RankAssignment.tenant; "" = none) may read: the shared ones,
// then its tenant's.
std::vector<std::string> RankDataRoots(const NodeIsolation& isolation, const std::string& tenant);

// The memory limit of a rank of `spec` in bytes (0 = none): memoryPerRankMib when set, else
// the node's per-slot cap. INVALID_ARGUMENT naming memoryPerRankMib (the spec's fault, refused
// rather than exceeding the cap) when it is negative or above 16777216, above the cap, or
// where isolation has no mechanism (never after SetUpIsolation).
absl::StatusOr<int64_t> RankMemoryLimit(const NodeIsolation& isolation, const v1::JobSpec& spec);

// Every problem with `assignment`'s spec on this node ("" when none), each naming its field:
// a path out of RankDataRoots for its tenant (naming the allowed roots), or a memory limit
// RankMemoryLimit refuses. The agent's cheap check before it starts a rank; a problem is the
// spec's fault.
std::string CheckRankSpec(const NodeIsolation& isolation, const v1::RankAssignment& assignment);

// One line for the agent's start-up log.
std::string DescribeIsolation(const NodeIsolation& isolation);

}  // namespace gradhub::agent
