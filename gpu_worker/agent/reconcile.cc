#include "gpu_worker/agent/reconcile.h"

#include "absl/strings/str_cat.h"

namespace gradhub::agent {

std::string RankKey::ToString() const {
  return absl::StrCat(job, " attempt ", attempt, " rank ", rank);
}

RankKey KeyOf(const v1::RankAssignment& assignment) {
  return {assignment.job(), assignment.attempt(), assignment.rank()};
}

RankKey KeyOf(const v1::RankStatus& status) {
  return {status.job(), status.attempt(), status.rank()};
}

std::set<AttemptKey> DiscardedAttempts(
    const google::protobuf::RepeatedPtrField<v1::AttemptRef>& attempts) {
  std::set<AttemptKey> keys;
  for (const v1::AttemptRef& attempt : attempts) keys.emplace(attempt.job(), attempt.attempt());
  return keys;
}

ReconcileActions Reconcile(const google::protobuf::RepeatedPtrField<v1::RankAssignment>& desired,
                           const std::map<RankKey, KnownRank>& known,
                           const std::set<RankKey>& ever_started,
                           const std::set<AttemptKey>& discarded) {
  ReconcileActions actions;
  std::set<RankKey> wanted;
  for (const v1::RankAssignment& assignment : desired) {
    const RankKey key = KeyOf(assignment);
    if (!wanted.insert(key).second) continue;  // repeated in the desired set
    if (ever_started.count(key) == 0 && known.count(key) == 0) actions.start.push_back(assignment);
  }
  for (const auto& [key, rank] : known) {
    if (wanted.count(key) != 0) continue;
    if (rank.exited) {
      actions.drop.push_back(key);
    } else if (discarded.count({key.job, key.attempt}) != 0) {
      if (!rank.kill_requested) actions.kill.push_back(key);
    } else if (!rank.stop_requested) {
      actions.stop.push_back(key);
    }
  }
  return actions;
}

bool OutageGraceExpired(absl::Duration since_success, absl::Duration api_outage_grace) {
  return since_success > api_outage_grace;
}

}  // namespace gradhub::agent
