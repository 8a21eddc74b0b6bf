// How an attempt ends badly, in one place: the scheduler's controller (a rank failed, a hang,
// a lost or drained node) and node registration (an agent restarted) all come here, so the
// budget rules and the history they leave are the same whatever noticed the failure.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "gradhub/v1/jobs.pb.h"
#include "services/api/job_records.h"
#include "services/common/db/pool.h"

namespace gradhub::api {

struct AttemptFailure {
  v1::JobEvent::Type event = v1::JobEvent::RANK_FAILED;  // or NODE_LOST, HANG_DETECTED
  // INFRASTRUCTURE and JOB spend their budget in JobSpec.max_restarts; USER fails the job.
  v1::JobEvent::FailureKind kind = v1::JobEvent::JOB;
  EventDetails details;  // message, rank, node, exit code, signal; failure_kind is set from kind
};

// The kind of failure a trainer's exit means (services/common/contract/trainer_exit_codes.h): a
// user error fails the job at once; losing peers or the store is the infrastructure's fault;
// anything else (NaN, a crash, a kill) is the job's.
v1::JobEvent::FailureKind FailureKindOfExit(int exit_code, int signal);

// The RANK_FAILED message of a rank that ended an attempt, cause first and the rank's own
// words apart, so that its last log line never reads as the cause:
//   stopped (by its agent, or forgotten with its node): "rank 2 was stopped by its agent: WHY";
//   failed: "rank 2 was killed by signal 9 (last log line: ...)" or
//           "rank 2 exited with code 1 (last log line: ...)".
// `agent_message` is what the agent reported: for a failed rank its last stderr line (or the
// exit itself, when it printed none), for a stopped one the reason it was stopped.
std::string RankFailureMessage(int32_t rank, bool stopped, int exit_code, int signal,
                               const std::string& agent_message);

// Fails `job`'s current attempt (the job read FOR UPDATE in `tx`, SCHEDULED or RUNNING): the
// attempt is marked FAILED, its live ranks STOPPING (agents stop them; the next attempt is
// placed only once they are gone), the failure is appended to the history, and the job goes
// RESTARTING while the failure's budget lasts, else FAILED. No-op for a job in another state.
absl::Status FailAttempt(db::Transaction& tx, const v1::Job& job, const AttemptFailure& failure);

// Marks every live rank on the node gone (STOPPED: the slot is free) and fails the current
// attempts they belonged to as INFRASTRUCTURE (NODE_LOST) with `why`: what happens to the
// ranks of an agent that restarted and of a node that stopped heartbeating.
absl::Status ForgetRanksOnNode(db::Transaction& tx, int64_t node_id, const std::string& node,
                               const std::string& why);

}  // namespace gradhub::api
