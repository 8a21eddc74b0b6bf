// What keeps a node's tenants apart, as the agent applies it to every rank (docs/architecture.md,
// "Isolation of tenants on a node"):
//   - the rank's user (rank_user.h): never root;
//   - the data roots: every path a spec names must lie under one (data_paths.h), checked by
//     the agent before it starts the rank (CheckSpecInputs) and by the trainer on the file it
//     opens (input_file.h), which gets the roots and the size cap through its environment;
//   - a memory limit per rank, a slot's share of the node (memory_limit.h).
// main builds it once from the flags (SetUpIsolation); the agent only reads it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "gpu_worker/agent/memory_limit.h"
#include "gpu_worker/agent/rank_user.h"
#include "gradhub/v1/jobs.pb.h"

namespace gradhub::agent {

struct AgentConfig;

struct NodeIsolation {
  RankIdentity identity;
  // Absolute and resolved (realpath), in flag order.
  std::vector<std::string> data_roots;
  int64_t max_input_bytes = 0;
  // Per rank; 0 = no limit.
  int64_t memory_limit_bytes = 0;
  MemoryMechanism memory_mechanism = MemoryMechanism::kNone;
  // With a cgroup mechanism: this agent's directory of rank cgroups.
  std::string cgroup_dir;
};

// The isolation `config` asks for on this machine, or INVALID_ARGUMENT naming the flag:
// --run-as (rank_user.h), --data-root (each must be an existing directory; its path may not
// contain ':', the separator of GRADHUB_DATA_ROOTS), --max-input-bytes (> 0),
// --memory-per-slot (0 = this machine's memory divided by --slots, < 0 = no limit),
// --memory-isolation and --cgroup-parent (memory_limit.h), and --work-dir and
// --checkpoint-root, which the rank's user must be able to enter.
absl::StatusOr<NodeIsolation> SetUpIsolation(const AgentConfig& config);

// Every problem with the paths `spec` names on this node ("" when none), each naming its
// field and the allowed roots: the agent's cheap check before it starts a rank.
std::string CheckSpecInputs(const NodeIsolation& isolation, const v1::JobSpec& spec);

// One line for the agent's start-up log.
std::string DescribeIsolation(const NodeIsolation& isolation);

}  // namespace gradhub::agent
