// A job's training history (JobService.GetJobMetrics): recorded from rank 0's progress and
// evaluation lines as NodeManager stores them, kept bounded per job, and downsampled for
// reading. The table is job_metric_points (migrations/0005_job_metrics.sql).
//
// Writing, in the transaction that stores a batch of rank 0's stdout lines:
//   1. ParseMetricLine picks out the trainer's progress records (progress_record.h) of the
//      events progress (step, loss, lr, samplesPerSecond) and eval (step and eval metrics).
//   2. RecordMetricPoints merges the batch's lines by step and upserts one row per step, only
//      for the job's current attempt. On a row already there: the same attempt merges (a
//      re-shipped line changes nothing), a newer attempt replaces it, an older one is ignored.
//   3. It then thins the job's oldest progress points once there are more than
//      kMaxProgressPointsPerJob of them (see ThinOldPoints in the .cc).
//   4. RecordJobProgress folds the same lines into the job's current progress (Job.progress).
// Reading: DownsampleByStep picks at most max_points of them evenly over the steps.
//
// Free functions without state; thread-safe as far as their arguments are.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "gradhub/v1/jobs.pb.h"
#include "services/common/db/pool.h"

namespace gradhub::api {

// Progress points (those without evaluation metrics) a job keeps. Evaluation points are
// never thinned, so a job that evaluates very often keeps more rows than this.
inline constexpr int64_t kMaxProgressPointsPerJob = 10000;

// What one line, or all lines of one step, say about that step. Unset values: not reported
// by these lines, or not a finite number (the trainer prints NaN and infinities as null).
struct MetricLine {
  int64_t step = 0;
  bool progress = false;  // from a progress line
  std::optional<int64_t> epoch;
  std::optional<double> loss;
  std::optional<double> learning_rate;
  std::optional<double> samples_per_second;
  int64_t total_steps = 0;                     // 0 = not said
  std::map<std::string, double> eval_metrics;  // names without the "eval." prefix
};

// nullopt for anything but a well-formed progress or evaluation line with a step >= 0.
std::optional<MetricLine> ParseMetricLine(const std::string& line);

// Records `lines` (any order, a step may repeat) for `attempt` of the job `job_id` (a uuid)
// inside the caller's transaction, then thins the job's points if they are over the bound.
// Lines of an attempt that is not the job's current one are dropped.
absl::Status RecordMetricPoints(db::Transaction& tx, const std::string& job_id, int32_t attempt,
                                const std::vector<MetricLine>& lines);

// The job's progress (the jobs.progress_* columns that Job.progress shows) from the lines of
// one batch (in the order received), for `attempt` if it is the job's current one: the last
// progress line's step, total, epoch, loss, learning rate and samples/s, and the metrics of
// the last evaluation. A value no line of the batch carries keeps what was stored, so an
// evaluation line (no loss, no learning rate) or a null (NaN) never blanks it. Taken while the
// job is SCHEDULED or RUNNING, and after it SUCCEEDED (agents ship its last lines after the
// exit) unless they are of an earlier step than its progress.
absl::Status RecordJobProgress(db::Transaction& tx, const std::string& job_id, int32_t attempt,
                               const std::vector<MetricLine>& lines);

// The history of `job` (already read, and its tenant checked, by the caller in `tx`),
// downsampled to at most `max_points` (>= 1) points by DownsampleByStep, evaluations kept.
absl::StatusOr<v1::JobMetrics> ReadJobMetrics(db::Transaction& tx, const v1::Job& job,
                                              size_t max_points);

// Indices (ascending) of at most `max_points` (>= 1) of the points at `steps` (ascending,
// distinct) to show: the first and the last, every index with `keep[i]`, and of the others at
// most one per interval of an equal division of the step range, with as many intervals as fit.
// When the first, the last and the kept ones alone are more than max_points, they are thinned
// evenly by position, the last always kept.
std::vector<size_t> DownsampleByStep(const std::vector<int64_t>& steps,
                                     const std::vector<bool>& keep, size_t max_points);

}  // namespace gradhub::api
