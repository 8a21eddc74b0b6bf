#include "gpu_worker/agent/rank_start.h"

#include <iostream>
#include <utility>

#include "gpu_worker/agent/isolation.h"
#include "gpu_worker/agent/rank_launch.h"
#include "gpu_worker/agent/reconcile.h"
#include "services/common/contract/trainer_exit_codes.h"

namespace gradhub::agent {
namespace {

// Reported like a failure of the trainer with `exit_code`: infrastructure unless the spec is at
// fault.
RankStart Failed(absl::Status error, int exit_code = trainer::kExitInfrastructure) {
  return {nullptr, std::move(error), exit_code};
}

// The process part of a rank's options: what to run, where, and where its output goes.
RankProcessOptions ProcessOptions(const RankLaunch& launch, LineCallback on_line) {
  RankProcessOptions options;
  options.argv = launch.argv;
  options.env = launch.env;
  options.working_dir = launch.dir;
  options.pid_file = launch.pid_file;
  options.on_line = std::move(on_line);
  return options;
}

}  // namespace

RankStart StartRankProcess(const AgentConfig& config, const v1::RankAssignment& assignment,
                           const absl::StatusOr<PreparedRank>& prepared, LineCallback on_line) {
  if (!prepared.ok()) return Failed(prepared.status());  // step 0
  absl::StatusOr<RankLaunch> launch = PlanRankLaunch(config, assignment, *prepared);
  if (!launch.ok()) return Failed(launch.status());
  // A path out of this node's data roots, or a file it will not read: the spec's fault, found
  // before anything is created (isolation.h); the trainer checks again on what it opens.
  if (std::string problem = CheckRankSpec(config.isolation, assignment); !problem.empty()) {
    return Failed(absl::InvalidArgumentError(problem), trainer::kExitUserError);
  }
  if (absl::Status files = PrepareRankFiles(*launch, assignment, prepared->identity); !files.ok()) {
    return Failed(files);
  }
  RankProcessOptions options = ProcessOptions(*launch, std::move(on_line));
  NodeIsolation isolation = config.isolation;
  isolation.identity = prepared->identity;
  if (absl::Status isolated = IsolateRank(isolation, *launch, assignment, &options);
      !isolated.ok()) {
    return Failed(isolated);
  }
  absl::StatusOr<std::unique_ptr<RankProcess>> process = RankProcess::Start(std::move(options));
  if (!process.ok()) return Failed(process.status());
  std::cerr << "gradhub-agent: started " << KeyOf(assignment).ToString() << " as pid "
            << (*process)->pid() << " uid " << prepared->identity.uid << " in " << launch->dir
            << " (GRADHUB_DEVICE=" << launch->env.at("GRADHUB_DEVICE")
            << " CUDA_VISIBLE_DEVICES=" << launch->env.at("CUDA_VISIBLE_DEVICES")
            << " GRADHUB_BACKEND=" << launch->env.at("GRADHUB_BACKEND") << ")\n";
  return {*std::move(process), absl::OkStatus(), 0};
}

namespace {

RankStart NodeFailed(absl::Status error) {
  return {nullptr, std::move(error), 0, v1::RankStatus::STOPPED};
}

}  // namespace

RankStart StartScriptProcess(const AgentConfig& config, const v1::RankAssignment& assignment,
                             const absl::StatusOr<PreparedRank>& prepared, LineCallback on_line) {
  if (!prepared.ok()) {  // step 1
    const absl::StatusCode code = prepared.status().code();
    if (code == absl::StatusCode::kNotFound || code == absl::StatusCode::kInvalidArgument) {
      return Failed(prepared.status(), trainer::kExitUserError);
    }
    return NodeFailed(prepared.status());
  }
  if (std::string problem = CheckRankSpec(config.isolation, assignment); !problem.empty()) {
    return Failed(absl::InvalidArgumentError(problem), trainer::kExitUserError);  // step 1
  }
  if (assignment.rank() == 0) {  // step 2
    if (absl::Status free = CheckMasterPortFree(assignment.master_port()); !free.ok()) {
      return NodeFailed(free);
    }
  }
  absl::StatusOr<RankLaunch> launch = PlanScriptLaunch(config, assignment, *prepared);  // 3
  if (!launch.ok()) return Failed(launch.status(), trainer::kExitUserError);
  if (absl::Status files = PrepareScriptFiles(*launch, prepared->identity); !files.ok()) {
    return NodeFailed(files);
  }
  RankProcessOptions options = ProcessOptions(*launch, std::move(on_line));
  options.message_lines = 5;
  NodeIsolation isolation = config.isolation;
  isolation.identity = prepared->identity;
  if (absl::Status isolated = IsolateRank(isolation, *launch, assignment, &options);
      !isolated.ok()) {
    return NodeFailed(isolated);
  }
  absl::StatusOr<std::unique_ptr<RankProcess>> process = RankProcess::Start(std::move(options));
  if (!process.ok()) return NodeFailed(process.status());  // step 4
  std::cerr << "gradhub-agent: started " << KeyOf(assignment).ToString() << " (script "
            << launch->argv[1] << ") as pid " << (*process)->pid() << " uid "
            << prepared->identity.uid << " in " << launch->dir << "\n";
  return {*std::move(process), absl::OkStatus(), 0};
}

}  // namespace gradhub::agent
