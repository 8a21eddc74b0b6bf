// Starting the trainer of one assignment (agent.h step 4), once prepared (rank_preparer.h:
// its job's uid and job token), in order:
//   0. the preparation's error, if any: the node's (reported as an infrastructure failure);
//   1. its launch plan: directory, argv, environment (rank_launch.h);
//   2. the spec checked against the node (isolation.h CheckRankSpec: its paths against the
//      data roots of its tenant, its memory limit against a slot's), before anything is
//      created: a failure is the spec's fault;
//   3. its directory and files prepared, its identity (the job's uid) and memory limit set
//      (rank_launch.h);
//   4. the process forked (rank_process.h), its output lines going to `on_line`.
#pragma once

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "gpu_worker/agent/config.h"
#include "gpu_worker/agent/rank_process.h"
#include "gpu_worker/agent/script_launch.h"
#include "gradhub/v1/nodes.pb.h"

namespace gradhub::agent {

struct RankStart {
  std::unique_ptr<RankProcess> process;  // null when it could not be started
  absl::Status error;                    // why not
  int exit_code = 0;                     // reported for it: user error when the spec is at fault
  // FAILED, or STOPPED for a script rank the node could not start (its exit codes are the
  // user's, so an infrastructure failure is reported as the agent's stop).
  v1::RankStatus::State state = v1::RankStatus::FAILED;
};

RankStart StartRankProcess(const AgentConfig& config, const v1::RankAssignment& assignment,
                           const absl::StatusOr<PreparedRank>& prepared, LineCallback on_line);

// A script job's rank (script_launch.h), once prepared (rank_preparer.h):
//   1. the preparation's error, if any: code that is missing or refused (NOT_FOUND,
//      INVALID_ARGUMENT) is the user's (exit 10), anything else the node's (STOPPED); then
//      the spec against this node (CheckRankSpec: its memory limit), the user's too;
//   2. rank 0: its MASTER_PORT must be free here (else STOPPED: the node's fault);
//   3. its launch plan and scratch directory, its identity (the job's uid) and memory limit;
//   4. the process forked, keeping its last 5 stderr lines for the failure's reason.
RankStart StartScriptProcess(const AgentConfig& config, const v1::RankAssignment& assignment,
                             const absl::StatusOr<PreparedRank>& prepared, LineCallback on_line);

}  // namespace gradhub::agent
