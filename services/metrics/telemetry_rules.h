// The rules of TrainingMetrics (training_metrics.h, rules 1 to 4 and the sweep) as small plain
// classes: no Prometheus, no lock, no directory, so that each is tested alone. TrainingMetrics
// applies them under its lock.
//
// Not thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "absl/time/time.h"
#include "services/metrics/job_directory.h"

namespace gradhub::metrics {

// Why steps were dropped; the `reason` label of gradhub_telemetry_dropped_total.
enum class DropReason {
  kTrainerQueueFull,
  kDuplicateStep,
  kStaleAttempt,
  kUnknownJob,
  kFinishedJob,
  kJobLimit,
  kInvalid,
  kUnavailable,
};
inline constexpr int kDropReasons = 8;
const char* DropReasonLabel(DropReason reason);

// Rule 2's memory: a refused job stays refused for `ttl`, so that a trainer that keeps sending
// costs no query per batch.
class RefusalCache {
 public:
  // Refusals kept between prunes, against a flood of made-up ids: when full, all are forgotten.
  static constexpr size_t kMaxRefusals = 10000;

  explicit RefusalCache(absl::Duration ttl) : ttl_(ttl) {}
  void Refuse(const std::string& id, DropReason reason, absl::Time now);
  // Why `id` is refused at `now`; nullopt when it is not (or no longer).
  std::optional<DropReason> Find(const std::string& id, absl::Time now) const;
  // Forgets the refusals whose time is up.
  void Prune(absl::Time now);
  size_t size() const { return refusals_.size(); }

 private:
  struct Refusal {
    DropReason reason;
    absl::Time until;
  };
  const absl::Duration ttl_;
  std::map<std::string, Refusal> refusals_;  // by job id
};

// Rule 2: why a job the directory knows (`status`) gets no series while `jobs_with_series` jobs
// have them; nullopt when it gets them.
std::optional<DropReason> RefuseNewJob(const JobStatus& status, int jobs_with_series, int max_jobs);

// What is known of a job with series: rules 1 and 3, and the sweep's rule.
class JobState {
 public:
  enum class AttemptCheck { kCurrent, kStale, kAskDirectory };

  explicit JobState(absl::Time now) : last_report_(now) {}
  // Rule 1: a rank must be below the job's world size.
  bool InWorld(int32_t rank) const { return rank < world_size_; }
  // Rule 3: only the current attempt counts. An attempt newer than known asks the directory
  // first (kAskDirectory), unless `directory_asked` (its answer was just Admit-ted).
  AttemptCheck CheckAttempt(int32_t attempt, bool directory_asked) const;
  // The directory's answer when a batch asked it: the attempt (never backwards), world size.
  void Admit(const JobStatus& status);
  // The directory's answer at a sweep: the attempt (never backwards), and whether the job
  // ended (and since when).
  void Sweep(const JobStatus& status, absl::Time now);
  void Reported(absl::Time now) { last_report_ = now; }
  // The sweep's rule: ended `finished_ttl` ago, or no batch for `idle_ttl`.
  bool Expired(absl::Time now, absl::Duration finished_ttl, absl::Duration idle_ttl) const;

 private:
  int32_t current_attempt_ = 0;
  int32_t world_size_ = 0;
  bool terminal_ = false;
  absl::Time ended_ = absl::InfiniteFuture();
  absl::Time last_report_;
};

// Per rank: rule 4, and the steps its reporter says it dropped.
class RankProgress {
 public:
  // A batch of `attempt` comes: a new attempt starts over (from its checkpoint, so from a
  // lower step).
  void StartBatch(int32_t attempt);
  // Rule 4: whether `step` is above the last accepted one of this attempt (else a duplicate,
  // from a reporter resending after a broken stream); if so it is the last accepted now.
  bool Accept(int64_t step);
  // The reporter's count is cumulative, so that a lost or resent batch neither loses nor
  // doubles it: the steps it dropped since the last count seen.
  int64_t NewTrainerDrops(int64_t cumulative);

 private:
  int32_t attempt_ = 0;
  int64_t last_step_ = -1;
  int64_t trainer_dropped_ = 0;  // the reporter's cumulative count last seen
};

}  // namespace gradhub::metrics
