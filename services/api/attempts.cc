#include "services/api/attempts.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "services/common/contract/job_states.h"
#include "services/common/status_macros.h"

namespace gradhub::api {

absl::Status ForgetRanksOnNode(db::Transaction& tx, int64_t node_id, const std::string& node,
                               const std::string& why) {
  // Fencing: a forgotten rank may still run (its node cut off from the api, not dead), but the
  // api has given up on it, so it can no longer act for its job. Its job token is revoked in
  // the same transaction: the checkpoint store, the rendezvous store and the metrics service
  // refuse it from now on, whatever its attempt's state.
  GRADHUB_ASSIGN_OR_RETURN(
      db::Result gone,
      tx.Exec(absl::StrCat("WITH gone AS (UPDATE rank_assignments SET state = 'STOPPED',"
                           " message = $2, update_time = now() WHERE node_id = $1 AND state IN ",
                           kLiveRankStatesSql,
                           " RETURNING job_id, attempt, rank),"
                           " revoked AS (UPDATE api_tokens k SET revoke_time = now() FROM gone"
                           "   WHERE k.kind = 'JOB' AND k.revoke_time IS NULL"
                           "   AND k.job_id = gone.job_id AND k.attempt = gone.attempt"
                           "   AND k.rank = gone.rank)"
                           " SELECT job_id::text AS job_id, attempt, rank FROM gone"),
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
    failure.message = why;
    failure.node = "nodes/" + node;
    failure.rank = rank;
    GRADHUB_RETURN_IF_ERROR(FailAttempt(tx, job, failure));
  }
  return absl::OkStatus();
}

absl::Status FailAttempt(db::Transaction& tx, const v1::Job& job, const AttemptFailure& failure) {
  if (job.state() != v1::Job::SCHEDULED && job.state() != v1::Job::RUNNING) {
    return absl::OkStatus();
  }
  const std::string id = JobId(job.name());
  EventDetails details = Because(failure.message);
  details.failure_kind = failure.kind;
  details.rank = failure.rank;
  details.node = failure.node;
  details.exit_code = failure.exit_code;
  details.signal = failure.signal;
  const std::string kind = v1::JobEvent::FailureKind_Name(failure.kind);
  GRADHUB_RETURN_IF_ERROR(
      tx.Exec("UPDATE job_attempts SET state = 'FAILED', failure_kind = $3, failure_message = $4,"
              " failed_rank = $5, exit_code = $6, signal = $7, discard_ranks = $8,"
              " end_time = now()"
              " WHERE job_id = $1::uuid AND attempt = $2 AND state IN ('SCHEDULED', 'RUNNING')",
              {id, job.attempt(), kind, details.message,
               details.rank >= 0 ? db::Param(details.rank) : db::Param(std::nullopt),
               details.exit_code, details.signal, FailureDiscardsRanks(failure)})
          .status());
  GRADHUB_RETURN_IF_ERROR(tx.Exec(absl::StrCat("UPDATE rank_assignments SET state = 'STOPPING',"
                                               " update_time = now() WHERE job_id = $1::uuid"
                                               " AND attempt = $2 AND state IN ",
                                               kRunnableRankStatesSql),
                                  {id, job.attempt()})
                              .status());
  GRADHUB_RETURN_IF_ERROR(
      AppendEvent(tx, id, job.attempt(), failure.event, std::nullopt, std::nullopt, details));

  std::string cause = absl::StrCat(kind, " failure of attempt ", job.attempt());
  if (details.rank >= 0) absl::StrAppend(&cause, ", rank ", details.rank);
  if (!details.node.empty()) absl::StrAppend(&cause, " on ", details.node);
  absl::StrAppend(&cause, ": ", details.message);
  const RestartDecision decision = DecideRestart(job, failure.kind, cause);
  if (!decision.restart) {
    return ApplyTransition(tx, job, v1::Job::FAILED, Because(decision.reason)).status();
  }
  GRADHUB_RETURN_IF_ERROR(
      tx.Exec(absl::StrCat("UPDATE jobs SET ", decision.counter, " = ", decision.counter,
                           " + 1, queued_time = now() WHERE id = $1::uuid"),
              {id})
          .status());
  return ApplyTransition(tx, job, v1::Job::RESTARTING, Because(decision.reason)).status();
}

}  // namespace gradhub::api
