#include "services/api/attempts.h"

#include <algorithm>
#include <map>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "services/common/contract/trainer_exit_codes.h"
#include "services/common/status_macros.h"

namespace gradhub::api {

v1::JobEvent::FailureKind FailureKindOfExit(int exit_code, int signal) {
  if (signal == 0 && exit_code == trainer::kExitUserError) return v1::JobEvent::USER;
  // Out of memory at the rank's limit: reported as this code, with signal 9 when the kernel's
  // cgroup OOM killer stopped it. The spec needs more than a slot gives; a retry cannot help.
  if (exit_code == trainer::kExitOutOfMemory) return v1::JobEvent::USER;
  if (signal == 0 &&
      (exit_code == trainer::kExitInfrastructure || exit_code == trainer::kExitPreempted)) {
    return v1::JobEvent::INFRASTRUCTURE;
  }
  return v1::JobEvent::JOB;
}

std::string RankFailureMessage(int32_t rank, bool stopped, int exit_code, int signal,
                               const std::string& agent_message) {
  if (stopped) {
    constexpr absl::string_view kAgentPrefix = "stopped by the agent: ";
    absl::string_view why = agent_message;
    if (absl::StartsWith(why, kAgentPrefix)) why.remove_prefix(kAgentPrefix.size());
    return absl::StrCat("rank ", rank, " was stopped by its agent", why.empty() ? "" : ": ", why);
  }
  const std::string exit = signal != 0 ? absl::StrCat("killed by signal ", signal)
                                       : absl::StrCat("exited with code ", exit_code);
  // Without output of its own the agent reports the exit itself, which says nothing new.
  const bool has_line = !agent_message.empty() && agent_message != exit;
  return absl::StrCat("rank ", rank, signal != 0 ? " was " : " ", exit,
                      has_line ? absl::StrCat(" (last log line: ", agent_message, ")") : "");
}

absl::Status ForgetRanksOnNode(db::Transaction& tx, int64_t node_id, const std::string& node,
                               const std::string& why) {
  GRADHUB_ASSIGN_OR_RETURN(
      db::Result gone,
      tx.Exec("UPDATE rank_assignments SET state = 'STOPPED', message = $2, update_time = now()"
              " WHERE node_id = $1 AND state IN ('ASSIGNED', 'STARTING', 'RUNNING', 'STOPPING')"
              " RETURNING job_id::text AS job_id, attempt, rank",
              {node_id, why}));
  // Each attempt that lost ranks here, with its lowest such rank (named in the event).
  std::map<std::pair<std::string, int32_t>, int32_t> first_rank;
  for (const db::Row& row : gone) {
    const auto key = std::make_pair(row.Get<std::string>("job_id"), row.Get<int32_t>("attempt"));
    const int32_t rank = row.Get<int32_t>("rank");
    auto [it, inserted] = first_rank.emplace(key, rank);
    if (!inserted) it->second = std::min(it->second, rank);
  }
  for (const auto& [attempt_key, rank] : first_rank) {
    const auto& [job_id, attempt] = attempt_key;
    GRADHUB_ASSIGN_OR_RETURN(v1::Job job, ReadJob(tx, "jobs/" + job_id, -1, true));
    if (job.attempt() != attempt) continue;
    AttemptFailure failure;
    failure.event = v1::JobEvent::NODE_LOST;
    failure.kind = v1::JobEvent::INFRASTRUCTURE;
    failure.details.message = why;
    failure.details.node = "nodes/" + node;
    failure.details.rank = rank;
    GRADHUB_RETURN_IF_ERROR(FailAttempt(tx, job, failure));
  }
  return absl::OkStatus();
}

absl::Status FailAttempt(db::Transaction& tx, const v1::Job& job, const AttemptFailure& failure) {
  if (job.state() != v1::Job::SCHEDULED && job.state() != v1::Job::RUNNING) {
    return absl::OkStatus();
  }
  const std::string id = JobId(job.name());
  EventDetails details = failure.details;
  details.failure_kind = failure.kind;
  const std::string kind = v1::JobEvent::FailureKind_Name(failure.kind);
  GRADHUB_RETURN_IF_ERROR(
      tx.Exec("UPDATE job_attempts SET state = 'FAILED', failure_kind = $3, failure_message = $4,"
              " failed_rank = $5, exit_code = $6, signal = $7, end_time = now()"
              " WHERE job_id = $1::uuid AND attempt = $2 AND state IN ('SCHEDULED', 'RUNNING')",
              {id, job.attempt(), kind, details.message,
               details.rank >= 0 ? db::Param(details.rank) : db::Param(std::nullopt),
               details.exit_code, details.signal})
          .status());
  GRADHUB_RETURN_IF_ERROR(
      tx.Exec("UPDATE rank_assignments SET state = 'STOPPING', update_time = now()"
              " WHERE job_id = $1::uuid AND attempt = $2"
              " AND state IN ('ASSIGNED', 'STARTING', 'RUNNING')",
              {id, job.attempt()})
          .status());
  GRADHUB_RETURN_IF_ERROR(
      AppendEvent(tx, id, job.attempt(), failure.event, std::nullopt, std::nullopt, details));

  // The budget this failure spends, and what is left of it.
  const char* counter = nullptr;
  int32_t used = 0, allowed = 0;
  if (failure.kind == v1::JobEvent::INFRASTRUCTURE) {
    counter = "infra_restarts";
    used = job.infrastructure_restarts();
    allowed = job.spec().max_restarts().infrastructure();
  } else if (failure.kind == v1::JobEvent::JOB) {
    counter = "job_restarts";
    used = job.job_restarts();
    allowed = job.spec().max_restarts().job();
  }
  std::string reason = absl::StrCat(kind, " failure of attempt ", job.attempt());
  if (details.rank >= 0) absl::StrAppend(&reason, ", rank ", details.rank);
  if (!details.node.empty()) absl::StrAppend(&reason, " on ", details.node);
  absl::StrAppend(&reason, ": ", details.message);
  if (counter == nullptr || used >= allowed) {
    if (counter != nullptr) {
      absl::StrAppend(&reason, " (", used, " of ", allowed, " ", kind, " restarts used)");
    }
    return ApplyTransition(tx, job, v1::Job::FAILED, Because(reason)).status();
  }
  GRADHUB_RETURN_IF_ERROR(tx.Exec(absl::StrCat("UPDATE jobs SET ", counter, " = ", counter,
                                               " + 1, queued_time = now() WHERE id = $1::uuid"),
                                  {id})
                              .status());
  absl::StrAppend(&reason, "; restart ", used + 1, " of ", allowed);
  return ApplyTransition(tx, job, v1::Job::RESTARTING, Because(reason)).status();
}

}  // namespace gradhub::api
