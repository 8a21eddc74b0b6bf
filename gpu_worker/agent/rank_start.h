// Starting the trainer of one assignment (agent.h step 4), in order:
//   1. its launch plan: directory, argv, environment (rank_launch.h);
//   2. the spec's inputs checked against the node's data roots (isolation.h), before anything
//      is created: a failure is the spec's fault;
//   3. its directory and files prepared, its identity and memory limit set (rank_launch.h);
//   4. the process forked (rank_process.h), its output lines going to `on_line`.
#pragma once

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "gpu_worker/agent/config.h"
#include "gpu_worker/agent/rank_process.h"
#include "gradhub/v1/nodes.pb.h"

namespace gradhub::agent {

struct RankStart {
  std::unique_ptr<RankProcess> process;  // null when it could not be started
  absl::Status error;                    // why not
  int exit_code = 0;                     // reported for it: user error when the spec is at fault
};

// `session_id` is the agent's current session (PlanRankLaunch).
RankStart StartRankProcess(const AgentConfig& config, const std::string& session_id,
                           const v1::RankAssignment& assignment, LineCallback on_line);

}  // namespace gradhub::agent
