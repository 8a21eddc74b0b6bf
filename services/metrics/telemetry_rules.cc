#include "services/metrics/telemetry_rules.h"

#include <algorithm>

namespace gradhub::metrics {

const char* DropReasonLabel(DropReason reason) {
  switch (reason) {
    case DropReason::kTrainerQueueFull:
      return "trainer_queue_full";
    case DropReason::kDuplicateStep:
      return "duplicate_step";
    case DropReason::kStaleAttempt:
      return "stale_attempt";
    case DropReason::kUnknownJob:
      return "unknown_job";
    case DropReason::kFinishedJob:
      return "finished_job";
    case DropReason::kJobLimit:
      return "job_limit";
    case DropReason::kInvalid:
      return "invalid";
    case DropReason::kUnavailable:
      return "unavailable";
  }
  return "invalid";
}

void RefusalCache::Refuse(const std::string& id, DropReason reason, absl::Time now) {
  if (refusals_.size() >= kMaxRefusals) refusals_.clear();
  refusals_[id] = {reason, now + ttl_};
}

std::optional<DropReason> RefusalCache::Find(const std::string& id, absl::Time now) const {
  auto it = refusals_.find(id);
  if (it == refusals_.end() || it->second.until <= now) return std::nullopt;
  return it->second.reason;
}

void RefusalCache::Prune(absl::Time now) {
  for (auto it = refusals_.begin(); it != refusals_.end();) {
    it = it->second.until <= now ? refusals_.erase(it) : std::next(it);
  }
}

std::optional<DropReason> RefuseNewJob(const JobStatus& status, int jobs_with_series,
                                       int max_jobs) {
  if (status.terminal) return DropReason::kFinishedJob;
  if (jobs_with_series >= max_jobs) return DropReason::kJobLimit;
  return std::nullopt;
}

JobState::AttemptCheck JobState::CheckAttempt(int32_t attempt, bool directory_asked) const {
  if (attempt > current_attempt_ && !directory_asked) return AttemptCheck::kAskDirectory;
  return attempt == current_attempt_ ? AttemptCheck::kCurrent : AttemptCheck::kStale;
}

void JobState::Admit(const JobStatus& status) {
  current_attempt_ = std::max(current_attempt_, status.current_attempt);
  world_size_ = status.world_size;
}

void JobState::Sweep(const JobStatus& status, absl::Time now) {
  current_attempt_ = std::max(current_attempt_, status.current_attempt);
  if (status.terminal && !terminal_) ended_ = now;
  terminal_ = status.terminal;
}

bool JobState::Expired(absl::Time now, absl::Duration finished_ttl, absl::Duration idle_ttl) const {
  return now - ended_ >= finished_ttl || now - last_report_ >= idle_ttl;
}

void RankProgress::StartBatch(int32_t attempt) {
  if (attempt == attempt_) return;
  attempt_ = attempt;
  last_step_ = -1;
  trainer_dropped_ = 0;
}

bool RankProgress::Accept(int64_t step) {
  if (step <= last_step_) return false;
  last_step_ = step;
  return true;
}

int64_t RankProgress::NewTrainerDrops(int64_t cumulative) {
  if (cumulative <= trainer_dropped_) return 0;
  const int64_t added = cumulative - trainer_dropped_;
  trainer_dropped_ = cumulative;
  return added;
}

}  // namespace gradhub::metrics
