// What a rank tells the world while it trains: rank 0's progress records (one JSON line each,
// contract/progress_record.h) and log lines, and every rank's record of each step for the
// metrics service (TelemetrySink). The loop calls it in this order:
//   1. StartLoop() once, so throughput counts from the first step and not from setup.
//   2. Per step: AddStep(report) with the step's timings and traffic; AddLoss(sum) whenever
//      the loss reader reads losses back (they may come a few steps late on a GPU).
//   3. At Cadence::LogsAt: ReportInterval, a collective (the loss averaged over the ranks);
//      then ReportEval and ReportCheckpointSave (or ReportCheckpointSkipped) when the step has
//      them.
//   4. SendStepTelemetry() at the end of the step's iteration, with what 3 added.
//   5. ReportDone() once, on every rank.
// Not thread-safe: the training thread drives it.
#pragma once

#include <c10/core/Device.h>

#include <chrono>
#include <cstdint>
#include <iosfwd>
#include <memory>
#include <optional>

#include "gpu_worker/ddp/comm/process_group.h"
#include "gpu_worker/trainer/async_checkpoint_writer.h"
#include "gpu_worker/trainer/forward_pass.h"
#include "gpu_worker/trainer/sinks.h"
#include "gpu_worker/trainer/trainer.h"
#include "gpu_worker/trainer/training_plan.h"
#include "gpu_worker/trainer/update_rule.h"
#include "services/common/contract/progress_record.h"

namespace gradhub::trainer {

// Where reports go: every one may be absent but the log.
struct ReportOutputs {
  std::ostream* progress = nullptr;  // progress records (rank 0's, and every rank's done)
  std::ostream* log = nullptr;       // null: std::cerr
  std::shared_ptr<TelemetrySink> telemetry;
};

// A run's checkpoints, for the done record (rank 0 with a checkpoint store).
struct CheckpointTotals {
  int64_t saved = 0;
  int64_t skipped = 0;     // periodic ones, while an upload was in flight
  int64_t last_bytes = 0;  // of the last snapshot
  // The training time they cost: the snapshot (the state serialized into host memory) and
  // the wait for a previous upload still running.
  double snapshot_seconds = 0, wait_seconds = 0;
};

// The end state of one rank, beside its TrainResult.
struct DoneFacts {
  double train_seconds = 0;  // the loop's, checkpoints and evaluations included
  int64_t optimizer_state_bytes = 0;
  std::optional<LossScaleStatus> loss_scale;
  std::optional<CheckpointTotals> checkpoints;
};

class ProgressReporter {
 public:
  ProgressReporter(const TrainingPlan& plan, const ReportOutputs& outputs,
                   std::shared_ptr<ddp::ProcessGroup> group, const c10::Device& device);

  std::ostream& log() { return log_; }
  // Rank 0: the model and the run's size, once set up; and the examples a pipeline drops
  // each epoch although dataset.dropLast is false (BatchPlan::pipeline_dropped_per_epoch).
  void LogStart(const std::string& model, int64_t train_examples, int64_t validation_examples);

  void StartLoop();  // step 1
  // Step 2: `step` holds the step done (counted from 1), its timings, learning rate, loss
  // (the last read), allreduce bytes, seconds and buckets.
  void AddStep(const StepReport& step);
  void AddLoss(double sum) { interval_.loss += sum; }
  // Step 3. The interval's averages as of step `step`; a collective.
  void ReportInterval(int64_t step, const std::optional<LossScaleStatus>& loss_scale);
  void ReportEval(int64_t step, const EvalResult& eval);
  void ReportCheckpointSave(double seconds) { step_record_.checkpoint_save_seconds = seconds; }
  // Rank 0 skipped the checkpoint of `step`: the upload of `in_flight` was still going out. A
  // log line and a checkpoint_skipped record (the job's CHECKPOINT_SKIPPED event).
  void ReportCheckpointSkipped(int64_t step, const InFlightSave& in_flight);
  // FP16: step `step` (counted from 1) was skipped because a gradient overflowed.
  void ReportSkippedStep(int64_t step, const LossScaleStatus& loss_scale);
  void SendStepTelemetry();                                            // step 4
  void ReportDone(const TrainResult& result, const DoneFacts& facts);  // step 5

 private:
  using Clock = std::chrono::steady_clock;

  // The start line's report of examples an epoch drops that the spec did not ask to drop.
  void LogDroppedExamples();

  // Per-interval sums behind a progress record.
  struct Interval {
    StepReport sums;
    double loss = 0;
    int64_t steps = 0;
    Clock::time_point start = Clock::now();
  };

  // The interval's per-step averages, the loss averaged over the ranks (a collective).
  StepReport IntervalAverages(int64_t step);
  void Emit(const StepReport& report, ProgressEvent event,
            const std::optional<LossScaleStatus>& loss_scale = std::nullopt);

  const TrainingPlan& plan_;
  std::ostream* const progress_;
  std::ostream& log_;
  const std::shared_ptr<TelemetrySink> telemetry_;
  const std::shared_ptr<ddp::ProcessGroup> group_;
  const c10::Device device_;
  Interval interval_;
  StepReport step_record_;  // of the step in progress of being reported
  // The engine's own measure of this rank's gradient allreduces over the run.
  int64_t run_allreduce_bytes_ = 0;
  double run_allreduce_seconds_ = 0;
};

}  // namespace gradhub::trainer
