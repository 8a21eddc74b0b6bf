// The trainer's machine-readable progress: one JSON object per line on its stdout, read by the
// agent (a rank is RUNNING once it reports a step; the step feeds the hang watchdog) and by the
// api (rank 0's lines are the job's progress and metric history, job_metrics.h). One writer and
// one parser, so that the three cannot drift.
//
// The line format, which users and tests grep for, so it does not change:
//   {"event":"progress","step":10,"totalSteps":100,"epoch":0,"loss":0.25,...}
//   - "event" is the first key: "progress" (every log interval), "eval" (an evaluation),
//     "checkpoint_skipped" (rank 0 skipped a periodic checkpoint: the previous upload was still
//     going out; the api makes it a CHECKPOINT_SKIPPED job event) or "done" (once per rank at
//     the end). A parser needs only a prefix test to skip the many lines that are not records.
//   - Then "rank" (done only) and "step"; the other keys, when set, in a fixed order
//     (kFieldsBeforeEval, the "eval.<name>" metrics by name, kFieldsAfterEval in the .cc).
//   - Numbers print with 9 significant digits; NaN and infinities print as null, which reads
//     back as unset.
//   - Keys a parser does not know are ignored, so a newer trainer may add some.
//
// Free functions without state; thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>

namespace gradhub {

enum class ProgressEvent { kProgress, kEval, kCheckpointSkipped, kDone };

// "progress", "eval", "checkpoint_skipped", "done".
const char* ProgressEventName(ProgressEvent event);

// One line. Unset fields are not printed; a parsed record has unset what its line did not
// say, said as null (a non-finite number) or said with the wrong type.
struct ProgressRecord {
  ProgressEvent event = ProgressEvent::kProgress;
  std::optional<int64_t> rank;  // done: the rank that reports its end state
  int64_t step = 0;             // optimizer steps done (>= 0); every record has one
  std::optional<int64_t> total_steps;
  // progress: the epoch, the interval's mean loss, learning rate, throughput of all ranks and
  // per-step phase timings. done: the last loss.
  std::optional<int64_t> epoch;
  std::optional<double> loss;
  std::optional<double> learning_rate;
  std::optional<double> samples_per_second;
  std::optional<double> forward_seconds;
  std::optional<double> backward_seconds;
  std::optional<double> allreduce_wait_seconds;
  std::optional<double> optimizer_seconds;
  std::optional<double> step_seconds;
  // done: run totals (allreduce_bytes is also the interval's on progress records).
  std::optional<double> train_seconds;
  std::optional<int64_t> allreduce_bytes;
  std::optional<double> allreduce_seconds;
  std::optional<int64_t> optimizer_state_bytes;
  std::optional<double> bus_bandwidth_bytes_per_second;
  // progress, done, with precision FP16 only: the loss scale after the step, and the optimizer
  // steps skipped so far because a gradient overflowed (the run's, resumed steps included).
  std::optional<double> loss_scale;
  std::optional<int64_t> skipped_steps;
  // eval, done: "eval.<name>" keys, names without the prefix. Parsed: finite numbers only,
  // non-empty names only.
  std::map<std::string, double> eval_metrics;
  // done, when the run saved checkpoints.
  std::optional<int64_t> checkpoints;
  std::optional<int64_t> checkpoint_bytes;
  std::optional<double> checkpoint_snapshot_seconds;
  std::optional<double> checkpoint_wait_seconds;
  // done, when the run skipped any: periodic checkpoints skipped while an upload was in flight.
  std::optional<int64_t> checkpoints_skipped;
  std::optional<std::string> parameters_sha256;  // done
  // checkpoint_skipped: the upload that was in flight, its step and how long it had been going
  // out (`step` is the step whose checkpoint was skipped).
  std::optional<int64_t> checkpoint_in_flight_step;
  std::optional<double> checkpoint_in_flight_seconds;
};

// The record as one line, without the newline.
std::string FormatProgressRecord(const ProgressRecord& record);

// The record `line` holds; nullopt for any other line: one that does not start with
// `{"event":"` (cheap, so call it on every line), is not a JSON object, names an event other
// than the four, or has no "step" that is an integer >= 0. Leading blanks are not skipped:
// the trainer prints none.
std::optional<ProgressRecord> ParseProgressRecord(std::string_view line);

}  // namespace gradhub
