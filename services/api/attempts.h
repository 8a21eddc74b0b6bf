// How an attempt ends badly, in one place: the scheduler's controller (a rank failed, a hang,
// a lost or drained node) and node registration (an agent restarted) all come here, so the
// budget rules and the history they leave are the same whatever noticed the failure.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "gradhub/v1/jobs.pb.h"
#include "services/api/scheduling_rules.h"
#include "services/common/db/pool.h"
#include "services/common/job_records.h"

namespace gradhub::api {

// Fails `job`'s current attempt (the job read FOR UPDATE in `tx`, SCHEDULED or RUNNING): the
// attempt is marked FAILED, its live ranks STOPPING (agents stop them, at once when the failure
// discards them, FailureDiscardsRanks; the next attempt is placed only once they are gone), the
// failure is appended to the history, and the job goes RESTARTING while the failure's budget lasts,
// else FAILED (DecideRestart). No-op for a job in another state.
absl::Status FailAttempt(db::Transaction& tx, const v1::Job& job, const AttemptFailure& failure);

// Marks every live rank on the node gone (STOPPED: the slot is free), revokes their job tokens
// (a rank cut off from the api may still run; nothing it sends is accepted any more), and fails
// the current attempts they belonged to as INFRASTRUCTURE (NODE_LOST) with `why`: what happens
// to the ranks of an agent that restarted and of a node that stopped heartbeating.
absl::Status ForgetRanksOnNode(db::Transaction& tx, int64_t node_id, const std::string& node,
                               const std::string& why);

}  // namespace gradhub::api
