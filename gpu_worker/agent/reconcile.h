// The agent's reconcile rule, steps 4 of the heartbeat protocol in nodes.proto, as a pure
// function: desired set + what the agent knows -> what to do. No gRPC, no processes.
#pragma once

#include <cstdint>
#include <map>
#include <ostream>
#include <set>
#include <string>
#include <tuple>
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

// What reconcile needs to know about a rank the agent still reports.
struct KnownRank {
  bool exited = false;          // exited (or never started); its exit is still reported
  bool stop_requested = false;  // Stop() already sent
};

struct ReconcileActions {
  std::vector<v1::RankAssignment> start;  // desired, key never seen: start it
  std::vector<RankKey> stop;              // running, not desired, not yet asked to stop
  std::vector<RankKey> drop;              // exited, not desired: stop reporting it
};

// Step 4:
//   - a desired rank whose key was never seen (not in `ever_started`, which includes every
//     key in `known`) is started, once even if the desired set repeats it;
//   - a running rank that is not desired is stopped (unless a stop is already under way);
//   - an exited rank that is not desired is dropped;
//   - an exited rank that is still desired is left alone and keeps being reported: an exited
//     key is never restarted, and neither is a dropped one (it stays in `ever_started`).
ReconcileActions Reconcile(const google::protobuf::RepeatedPtrField<v1::RankAssignment>& desired,
                           const std::map<RankKey, KnownRank>& known,
                           const std::set<RankKey>& ever_started);

}  // namespace gradhub::agent
