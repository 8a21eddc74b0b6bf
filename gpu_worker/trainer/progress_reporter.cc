#include "gpu_worker/trainer/progress_reporter.h"

#include <torch/torch.h>

#include <cstdio>
#include <iostream>

namespace gradhub::trainer {
namespace {

double Seconds(std::chrono::nanoseconds duration) {
  return std::chrono::duration<double>(duration).count();
}

void AddLossScale(const std::optional<LossScaleStatus>& loss_scale, ProgressRecord& record) {
  if (!loss_scale) return;
  record.loss_scale = loss_scale->scale;
  record.skipped_steps = loss_scale->skipped_steps;
}

}  // namespace

ProgressReporter::ProgressReporter(const TrainingPlan& plan, const ReportOutputs& outputs,
                                   std::shared_ptr<ddp::ProcessGroup> group,
                                   const c10::Device& device)
    : plan_(plan),
      progress_(outputs.progress),
      log_(outputs.log ? *outputs.log : std::cerr),
      telemetry_(outputs.telemetry),
      group_(std::move(group)),
      device_(device) {}

void ProgressReporter::LogStart(const std::string& model, int64_t train_examples,
                                int64_t validation_examples) {
  if (!plan_.leader()) return;
  log_ << "gradhub-trainer: " << model << "; " << train_examples << " train / "
       << validation_examples << " validation examples; " << plan_.batches.total_steps
       << " steps of " << plan_.global_batch() << " samples\n";
  LogDroppedExamples();
}

// Said because the spec did not ask for it (dataset.dropLast is false, or it asked only for
// the partial batch).
void ProgressReporter::LogDroppedExamples() {
  const BatchPlan& batches = plan_.batches;
  const int replicas = plan_.pipeline.replicas;
  const auto drops = [&](int64_t dropped) {
    log_ << "gradhub-trainer: each epoch drops the last " << dropped << " examples";
    if (replicas > 1) {
      log_ << " of each of the " << replicas << " replicas' shards (" << dropped * replicas
           << " in all)";
    }
  };
  if (batches.pipeline_dropped_per_epoch > 0) {
    drops(batches.pipeline_dropped_per_epoch);
    log_ << ", although dataset.dropLast is false: a pipeline's micro-batches must be equal, so "
            "it trains whole batches of "
         << batches.per_rank << " only\n";
  }
  if (batches.accumulation_dropped_per_epoch > 0) {
    drops(batches.accumulation_dropped_per_epoch);
    log_ << ": gradAccumulationSteps " << batches.accumulation
         << " does not divide the epoch's micro-batches, and an optimizer step takes whole "
            "groups of them only\n";
  }
}

void ProgressReporter::StartLoop() { interval_ = Interval(); }

void ProgressReporter::AddStep(const StepReport& step) {
  run_allreduce_bytes_ += step.allreduce_bytes;
  run_allreduce_seconds_ += step.allreduce_seconds;
  StepReport& sums = interval_.sums;
  sums.forward_seconds += step.forward_seconds;
  sums.backward_seconds += step.backward_seconds;
  sums.allreduce_wait_seconds += step.allreduce_wait_seconds;
  sums.optimizer_seconds += step.optimizer_seconds;
  sums.step_seconds += step.step_seconds;
  sums.allreduce_bytes = step.allreduce_bytes;
  sums.buckets = step.buckets;
  sums.learning_rate = step.learning_rate;
  ++interval_.steps;  // its loss is added when read (AddLoss)
  if (!telemetry_) return;
  // This rank's record of the step: sent at the end of the step's iteration, once an
  // evaluation and a checkpoint of the step have added theirs.
  StepReport& r = step_record_;
  r = step;
  r.epoch = (step.step - 1) / plan_.batches.steps_per_epoch;
  r.samples = plan_.batches.samples_per_step();
  r.samples_per_second = r.step_seconds > 0 ? r.samples / r.step_seconds : 0;
  r.world_size = plan_.world_size;
}

StepReport ProgressReporter::IntervalAverages(int64_t step) {
  // The loss of all ranks, not only rank 0's shard; with pipeline stages, of each replica's
  // stage 0, which stands for its replica's ranks (PipelinePlan::loss_weight).
  const double weighted = interval_.loss / interval_.steps * plan_.pipeline.loss_weight();
  at::Tensor mean_loss = torch::tensor({weighted}, at::kDouble).to(device_);
  group_->AllReduce(mean_loss, ddp::ReduceOp::kAverage)->Wait();
  const double elapsed = Seconds(Clock::now() - interval_.start);
  StepReport r = interval_.sums;
  for (double* value : {&r.forward_seconds, &r.backward_seconds, &r.allreduce_wait_seconds,
                        &r.optimizer_seconds, &r.step_seconds}) {
    *value /= interval_.steps;
  }
  r.step = step;
  r.epoch = (step - 1) / plan_.batches.steps_per_epoch;
  r.loss = mean_loss.item<double>();
  r.samples_per_second = elapsed > 0 ? interval_.steps * plan_.global_batch() / elapsed : 0;
  return r;
}

void ProgressReporter::ReportInterval(int64_t step,
                                      const std::optional<LossScaleStatus>& loss_scale) {
  const StepReport r = IntervalAverages(step);
  Emit(r, ProgressEvent::kProgress, loss_scale);
  if (plan_.leader()) {
    log_ << "gradhub-trainer: step " << step << "/" << plan_.batches.total_steps << " loss "
         << r.loss << " lr " << r.learning_rate << " " << static_cast<int64_t>(r.samples_per_second)
         << " samples/s";
    if (loss_scale) {
      log_ << " loss scale " << loss_scale->scale << " skipped " << loss_scale->skipped_steps;
    }
    log_ << "\n";
  }
  interval_ = Interval();
}

void ProgressReporter::ReportEval(int64_t step, const EvalResult& eval) {
  step_record_.eval_metrics = eval.metrics;
  StepReport r;
  r.step = step;
  r.eval_metrics = eval.metrics;
  Emit(r, ProgressEvent::kEval);
  if (plan_.leader()) {
    log_ << "gradhub-trainer: step " << step << " validation";
    for (const auto& [name, value] : eval.metrics) log_ << " " << name << " " << value;
    log_ << "\n";
  }
}

void ProgressReporter::ReportSkippedStep(int64_t step, const LossScaleStatus& loss_scale) {
  if (!plan_.leader()) return;
  log_ << "gradhub-trainer: step " << step
       << " skipped: a gradient overflowed float16; loss scale now " << loss_scale.scale << ", "
       << loss_scale.skipped_steps << " steps skipped\n";
}

void ProgressReporter::ReportCheckpointSkipped(int64_t step, const InFlightSave& in_flight) {
  if (!plan_.leader()) return;
  char seconds[32];
  std::snprintf(seconds, sizeof(seconds), "%.1f", in_flight.seconds);
  log_ << "gradhub-trainer: checkpoint at step " << step << " skipped: the upload of step "
       << in_flight.step << " has been going out for " << seconds << " s\n";
  if (progress_ == nullptr) return;
  ProgressRecord record;
  record.event = ProgressEvent::kCheckpointSkipped;
  record.step = step;
  record.total_steps = plan_.batches.total_steps;
  record.checkpoint_in_flight_step = in_flight.step;
  record.checkpoint_in_flight_seconds = in_flight.seconds;
  *progress_ << FormatProgressRecord(record) << std::endl;
}

void ProgressReporter::SendStepTelemetry() {
  if (telemetry_) telemetry_->Report(step_record_);
}

void ProgressReporter::Emit(const StepReport& r, ProgressEvent event,
                            const std::optional<LossScaleStatus>& loss_scale) {
  if (!plan_.leader() || progress_ == nullptr) return;
  ProgressRecord record;
  record.event = event;
  record.step = r.step;
  record.total_steps = plan_.batches.total_steps;
  if (r.eval_metrics.empty()) {
    record.epoch = r.epoch;
    record.loss = r.loss;
    record.learning_rate = r.learning_rate;
    record.samples_per_second = r.samples_per_second;
    record.forward_seconds = r.forward_seconds;
    record.backward_seconds = r.backward_seconds;
    record.allreduce_wait_seconds = r.allreduce_wait_seconds;
    record.optimizer_seconds = r.optimizer_seconds;
    record.step_seconds = r.step_seconds;
    record.allreduce_bytes = r.allreduce_bytes;
    AddLossScale(loss_scale, record);
  }
  record.eval_metrics = r.eval_metrics;
  *progress_ << FormatProgressRecord(record) << std::endl;
}

// Every rank reports its end state, so a launcher can tell the ranks agree.
void ProgressReporter::ReportDone(const TrainResult& result, const DoneFacts& facts) {
  if (progress_ == nullptr) return;
  ProgressRecord record;
  record.event = ProgressEvent::kDone;
  record.rank = plan_.rank;
  record.step = result.steps;
  record.total_steps = plan_.batches.total_steps;
  record.loss = result.final_loss;
  record.train_seconds = facts.train_seconds;
  record.allreduce_bytes = run_allreduce_bytes_;
  record.allreduce_seconds = run_allreduce_seconds_;
  record.optimizer_state_bytes = facts.optimizer_state_bytes;
  record.bus_bandwidth_bytes_per_second =
      BusBandwidth(run_allreduce_bytes_, run_allreduce_seconds_, plan_.world_size);
  AddLossScale(facts.loss_scale, record);
  record.eval_metrics = result.eval_metrics;
  if (const std::optional<CheckpointTotals>& checkpoints = facts.checkpoints) {
    record.checkpoints = checkpoints->saved;
    record.checkpoint_bytes = checkpoints->last_bytes;
    record.checkpoint_snapshot_seconds = checkpoints->snapshot_seconds;
    record.checkpoint_wait_seconds = checkpoints->wait_seconds;
    if (checkpoints->skipped > 0) record.checkpoints_skipped = checkpoints->skipped;
  }
  record.parameters_sha256 = result.parameters_sha256;
  *progress_ << FormatProgressRecord(record) << std::endl;
}

}  // namespace gradhub::trainer
