#pragma once

#include "gradhub/v1/jobs.pb.h"

namespace gradhub {

// Whether a job has ended for good: SUCCEEDED, FAILED or CANCELLED (jobs.proto's lifecycle).
// CANCELLING is not: processes of the job may still run. The one definition the api, the CLI
// and the tests share.
inline bool IsTerminal(v1::Job::State state) {
  return state == v1::Job::SUCCEEDED || state == v1::Job::FAILED || state == v1::Job::CANCELLED;
}

// Rank assignment states (table rank_assignments, nodes.proto's RankStatus) in which a rank
// holds its slot: placed and not yet reported gone. STOPPING ranks still hold theirs.
inline constexpr const char* kLiveRankStates[] = {"ASSIGNED", "STARTING", "RUNNING", "STOPPING"};
// The same set as SQL: `a.state IN kLiveRankStatesSql`.
inline constexpr char kLiveRankStatesSql[] = "('ASSIGNED', 'STARTING', 'RUNNING', 'STOPPING')";
// The live states a rank can still be asked to stop from (STOPPING already has been).
inline constexpr char kRunnableRankStatesSql[] = "('ASSIGNED', 'STARTING', 'RUNNING')";

}  // namespace gradhub
