// The metrics service's state: trainers' per-step telemetry turned into Prometheus series, with
// the rules that keep them truthful and few. No gRPC, no HTTP: TelemetryService feeds it,
// the HTTP endpoint scrapes it.
//
// Series (prometheus-cpp families; `job_id` is the job's uuid, not `job`, which Prometheus gives
// every scraped series as the name of its scrape job):
//   gradhub_training_step{job_id,rank}                       last step reported
//   gradhub_training_loss{job_id,rank}                       that step's loss on the rank
//   gradhub_learning_rate{job_id}                            NaN until reported; a NaN step's
//                                                            leaves it
//   gradhub_samples_per_second{job_id,rank}                  the rank's; the job's is the sum
//   gradhub_samples_total{job_id,rank}
//   gradhub_step_phase_seconds{job_id,rank,phase}            summary (count and sum only):
//       phase = forward|backward|allreduce_wait|optimizer|step; rate(_sum)/rate(_count) is the
//       exact mean of a phase over any window, so phases stack to the step time and ranks
//       compare for stragglers, at 2 series per rank and phase (a histogram takes 10+)
//   gradhub_allreduce_seconds{job_id}                        histogram of steps' allreduce time
//   gradhub_allreduce_bytes_total{job_id}                    summed over ranks
//   gradhub_allreduce_bus_bandwidth_bytes_per_second{job_id,rank}  last batch's mean
//   gradhub_checkpoint_save_seconds{job_id}                  histogram
//   gradhub_eval_metric{job_id,name}                         last evaluation
//   gradhub_pipeline_{bubble_fraction,p2p_bytes_total,p2p_wait_seconds_total,
//       peak_activation_bytes}{job_id,rank,stage}            pipeline stages' ranks only
//       (pipeline_series.h)
//   gradhub_telemetry_dropped_total{reason}                  steps lost: by trainers
//       (trainer_queue_full) or refused here (duplicate_step, stale_attempt, unknown_job,
//       finished_job, job_limit, invalid, unavailable)
//   gradhub_telemetry_steps_total, gradhub_telemetry_jobs    accepted steps, jobs with series
//   gradhub_telemetry_streams                                open ReportTelemetry streams
//
// Rules, in the order a batch meets them:
//   1. The job must exist (JobDirectory), and a rank must be below its world size.
//   2. A job without series gets them only while it has not ended and fewer than max_jobs
//      jobs have series; otherwise its steps are refused (and the refusal remembered for
//      refusal_ttl, so a trainer that keeps sending costs no query per batch).
//   3. Only the job's current attempt counts: a batch of an older attempt is dropped; one of a
//      newer attempt than known makes the job be read again.
//   4. Per rank, a step not above the last accepted one of the same attempt is a duplicate
//      (a reporter resending after a broken stream).
// Sweep() rereads every job with series: one ended finished_job_ttl ago, or silent for
// idle_job_ttl, loses its series.
//
// Its parts: the rules above as plain classes (telemetry_rules.h) and the Prometheus series
// (training_series.h); this class holds the jobs' entries under one lock and asks the directory.
//
// Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gradhub/v1/telemetry.pb.h"
#include "services/metrics/job_directory.h"
#include "services/metrics/telemetry_rules.h"

namespace prometheus {
class Registry;
}  // namespace prometheus

namespace gradhub::metrics {

class SeriesFamilies;
class TelemetryCounters;

struct TrainingMetricsOptions {
  // Jobs with series at once; steps of further jobs are refused (reason job_limit).
  int max_jobs = 200;
  // How long a job's series stay after it ended (for dashboards to show its end).
  absl::Duration finished_job_ttl = absl::Minutes(10);
  // A job without telemetry for this long loses its series, whatever its state.
  absl::Duration idle_job_ttl = absl::Hours(1);
  // How long a refused job stays refused without asking the directory again.
  absl::Duration refusal_ttl = absl::Seconds(30);
  // Distinct evaluation metric names kept per job; further names are ignored.
  int max_eval_metrics_per_job = 32;
};

struct BatchOutcome {
  int64_t accepted = 0;
  int64_t dropped = 0;
};

class TrainingMetrics {
 public:
  // `directory` is not owned and must outlive this.
  TrainingMetrics(JobDirectory* directory, TrainingMetricsOptions options);
  ~TrainingMetrics();

  // Records a batch whose job name, attempt and rank the caller has validated (JobIdOf is
  // not empty, attempt >= 1, rank >= 0). May read the directory; never holds the lock then.
  BatchOutcome Record(const v1::TelemetryBatch& batch, absl::Time now = absl::Now());

  // Rereads the jobs with series and removes those whose time is up (see the rules above).
  // An error when the directory cannot be read; idle jobs are removed even then.
  absl::Status Sweep(absl::Time now = absl::Now());

  // Steps lost for `reason` that did not come through Record (e.g. a stream the service
  // refused as a whole).
  void CountDropped(DropReason reason, int64_t steps);

  // Open telemetry streams (gradhub_telemetry_streams) go up or down by `delta`.
  void AddStreams(int delta);

  // Prometheus text exposition format 0.0.4 of every series.
  std::string Scrape() const;

  int live_jobs() const;

 private:
  struct RankEntry;
  struct JobEntry;
  enum class Admission { kAdmitted, kRefused, kAskDirectory };

  // Rules 1-3: the job's entry, or nullptr with *refused set.
  JobEntry* Admit(const std::string& id, int32_t attempt, absl::Time now,
                  std::unique_lock<std::mutex>& lock, DropReason* refused);
  Admission AdmitLocked(const std::string& id, int32_t attempt, absl::Time now,
                        const JobStatus* status, JobEntry** entry, DropReason* refused);
  RankEntry& Rank(const std::string& id, JobEntry& job, int32_t rank);
  // Applies the sweep's answer (`found` for the ids `asked`) to `job`: true when its series go.
  bool SweepJob(const std::string& id, JobEntry& job, absl::Time now,
                const absl::StatusOr<std::map<std::string, JobStatus>>& found,
                const std::set<std::string>& asked);
  void RemoveSeries(const JobEntry& job);

  JobDirectory* const directory_;
  const TrainingMetricsOptions options_;
  std::shared_ptr<prometheus::Registry> registry_;
  // Built in this order, which is the order the registry lists their families in.
  std::unique_ptr<SeriesFamilies> families_;
  std::unique_ptr<TelemetryCounters> counters_;  // thread-safe, used without mu_

  mutable std::mutex mu_;
  std::map<std::string, std::unique_ptr<JobEntry>> jobs_;  // by job id; guarded by mu_
  RefusalCache refused_;                                   // guarded by mu_
};

}  // namespace gradhub::metrics
