// The agent's rules, as pure functions: reconcile (step 4 of the heartbeat protocol in
// nodes.proto: desired set + what the agent knows -> what to do) and what an outage of the
// api means for the ranks (step 7). No gRPC, no processes.
//
// Surviving a control-plane outage, as the agent sees it (the api's side: scheduler.h):
//   1. A Heartbeat fails (UNAVAILABLE, deadline): the agent retries with backoff (at most an
//      interval apart) and keeps every rank running; so does each rank, which needs the api
//      only to rendezvous.
//   2. Once no Heartbeat has succeeded for --api-outage-grace, it stops every rank (SIGTERM,
//      SIGKILL after --stop-grace) with the reason, which it reports as the ranks' message.
//   3. A Heartbeat that succeeds again carries the same session: the api adopts the running
//      ranks as they are (or records the stopped ones, whose attempts then restart).
//   4. FAILED_PRECONDITION instead (the api declared the node LOST: it stayed silent past the
//      api's lease): the ranks' attempts have already failed; the agent stops them and
//      registers again (agent.h step 6).
#pragma once

#include "absl/time/time.h"

#include <cstdint>
#include <map>
#include <ostream>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "gradhub/v1/nodes.pb.h"

namespace gradhub::agent {

// A rank is identified by (job, attempt, rank); a restarted job is a new attempt, hence a
// new key.
struct RankKey {
  std::string job;  // `jobs/{job_id}`
  int32_t attempt = 0;
  int32_t rank = 0;

  bool operator<(const RankKey& other) const {
    return std::tie(job, attempt, rank) < std::tie(other.job, other.attempt, other.rank);
  }
  bool operator==(const RankKey& other) const {
    return std::tie(job, attempt, rank) == std::tie(other.job, other.attempt, other.rank);
  }
  std::string ToString() const;  // "jobs/x attempt 2 rank 0"
};

inline std::ostream& operator<<(std::ostream& out, const RankKey& key) {
  return out << key.ToString();
}

RankKey KeyOf(const v1::RankAssignment& assignment);
RankKey KeyOf(const v1::RankStatus& status);

// An attempt: (`jobs/{job_id}`, attempt).
using AttemptKey = std::pair<std::string, int32_t>;

// HeartbeatResponse.discarded_attempts as a set.
std::set<AttemptKey> DiscardedAttempts(
    const google::protobuf::RepeatedPtrField<v1::AttemptRef>& attempts);

// What reconcile needs to know about a rank the agent still reports.
struct KnownRank {
  bool exited = false;          // exited (or never started); its exit is still reported
  bool stop_requested = false;  // Stop() already sent (with the grace, or at once)
  bool kill_requested = false;  // Kill() already sent
};

struct ReconcileActions {
  std::vector<v1::RankAssignment> start;  // desired, key never seen: start it
  std::vector<RankKey> stop;  // running, not desired, not yet asked to stop: SIGTERM, grace
  std::vector<RankKey> kill;  // running, not desired, attempt discarded: SIGKILL now
  std::vector<RankKey> drop;  // exited, not desired: stop reporting it
};

// Step 4:
//   - a desired rank whose key was never seen (not in `ever_started`, which includes every
//     key in `known`) is started, once even if the desired set repeats it;
//   - a running rank that is not desired is killed (SIGKILL, no grace) when its attempt is in
//     `discarded` (nodes.proto step 4a), even if a graceful stop is under way, and only once;
//   - any other running rank that is not desired is stopped (SIGTERM, then SIGKILL after the
//     grace: step 4b), unless a stop is already under way;
//   - an exited rank that is not desired is dropped;
//   - an exited rank that is still desired is left alone and keeps being reported: an exited
//     key is never restarted, and neither is a dropped one (it stays in `ever_started`).
// A desired rank is never killed or stopped, whatever `discarded` says.
ReconcileActions Reconcile(const google::protobuf::RepeatedPtrField<v1::RankAssignment>& desired,
                           const std::map<RankKey, KnownRank>& known,
                           const std::set<RankKey>& ever_started,
                           const std::set<AttemptKey>& discarded = {});

// Step 2 of the outage protocol above: whether ranks must be stopped now, `since_success`
// after the last successful Heartbeat (or registration).
bool OutageGraceExpired(absl::Duration since_success, absl::Duration api_outage_grace);

}  // namespace gradhub::agent
