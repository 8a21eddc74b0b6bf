// One stage of a pipeline-parallel replica: runs the stage's part of one training step.
//
// Layout (layout.h): world = S stages x D replicas, rank = replica * S + stage. Stage s sends
// activations to rank + 1 and receives them from rank - 1 (around the replica's ring when
// interleaved); its data-parallel group {d * S + s} averages its gradients through the
// DistributedDataParallel of each chunk.
//
// One step on every rank (the caller zeroes gradients before it and steps the optimizer after
// it, as with DistributedDataParallel alone):
//  1. Split the replica's batch into M equal micro-batches: inputs on the first stage, targets
//     on the last (std::invalid_argument naming parallelism.microBatches when they do not
//     divide it).
//  2. Run StageActions(schedule, S, s, M, v) in order:
//     - forward of (micro-batch, chunk): the input is the micro-batch (virtual stage 0) or
//       ReceiveActivation from the previous virtual stage; the chunk's forward runs through its
//       DistributedDataParallel under NoSync; the output goes to SendActivation (its terminal
//       is kept), or on the last virtual stage into the loss, scaled by micro-batch size /
//       batch size so that the micro-batches' losses sum to the mean over the batch (the
//       terminal is then the scaled loss, or loss_for_backward of it). Before sending, it
//       posts the gradient receives GradientReceivesAhead lists for this micro-batch, so that
//       neighbours issue their transfers in the same order (what NCCL's one stream needs;
//       Gloo takes any order). Last, where the group takes transfers in any order (Gloo), it
//       posts the receive of the next micro-batch's input across the same boundary
//       (PostActivationReceive), so that the activation lands while this stage computes
//       rather than once its next forward asked for it (tests/bench/pipeline/bubble.sh).
//     - backward of (micro-batch, chunk): terminal.backward(), which receives the output's
//       gradient from the next stage and sends the input's to the previous one. The chunk's
//       last backward of the step, with sync_gradients, arms its DistributedDataParallel just
//       before (as torch.distributed.pipelining calls prepare_for_backward), so its Reducer
//       allreduces once per step, overlapping that backward; every other backward runs with
//       gradient sync off.
//     Completed sends are released after each action.
//  3. Wait for every send, then the last stage sends the step's loss to stage 0 of its replica
//     (global rank 0, which logs it). That one send is not waited for: it completes when
//     stage 0 ends its step, which the last stage need not wait for (its next step's first
//     receive waits anyway); the next step releases it, and the process group holds it when
//     the stage is destroyed first.
//
// Peers that fail: a stage whose forward throws, or whose process dies, leaves its neighbours
// waiting in a receive, which fails with CommError by the group's timeout (or at once when the
// connection closes); their own neighbours then fail the same way, so no stage hangs.
//
// Backends: GPipe and 1F1B run on Gloo and on NCCL (their transfer order is simulated on one
// stream per rank in pipeline_schedule_test); interleaved 1F1B only on Gloo, whose transfers
// may come in any order (GradientReceivesAhead derives no order for it).
//
// Not thread-safe: the stage's training thread drives it.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "gpu_worker/ddp/comm/process_group.h"
#include "gpu_worker/ddp/distributed_data_parallel.h"
#include "gpu_worker/ddp/pipeline/layout.h"
#include "gpu_worker/ddp/pipeline/schedule.h"
#include "gpu_worker/ddp/pipeline/stage_autograd.h"

namespace gradhub::ddp::pipeline {

// One piece of the model on this stage (one per chunk; v with the interleaved schedule, where
// chunk c is virtual stage c * S + s).
struct StageChunk {
  // The piece's forward, e.g. [&](const at::Tensor& x) { return module->forward(x); }.
  std::function<at::Tensor(const at::Tensor&)> forward;
  // Averages the piece's gradients over the stage's replicas; it must outlive the stage.
  // Required when D > 1; may be null when D = 1.
  DistributedDataParallel* ddp = nullptr;
};

// The loss of one micro-batch: the MEAN over its samples (the stage scales it).
using LossFunction = std::function<at::Tensor(const at::Tensor& output, const at::Tensor& target)>;

struct PipelineStageOptions {
  PipelineSchedule schedule = PipelineSchedule::kOneFOneB;
  int micro_batches = 1;
  int chunks_per_stage = 1;  // > 1 only with kInterleavedOneFOneB
  // Where received activations, gradients and the loss are made: the stage's device.
  c10::Device device = c10::Device(c10::kCPU);
};

struct StepBatch {
  at::Tensor inputs;   // the first stage's: the replica's batch (dim 0: samples)
  at::Tensor targets;  // the last stage's
};

struct StepControl {
  // false: no backward of the step synchronizes gradients (local SGD's local steps).
  bool sync_gradients = true;
  // What the last stage runs backward on, given the scaled loss (FP16: loss * scale); null:
  // the scaled loss itself.
  std::function<at::Tensor(const at::Tensor&)> loss_for_backward;
};

// What one step of this stage did.
struct StageStepReport {
  // The mean loss over the replica's batch, float64 on the stage's device: on the last stage
  // and on stage 0 (sent to it); undefined on the stages between.
  at::Tensor loss;
  double step_seconds = 0;  // the Step call: no data loading, no optimizer
  // Computing, without the waits and sends below.
  double forward_seconds = 0;
  double backward_seconds = 0;
  double send_seconds = 0;            // issuing sends and waiting for them at the end
  double receive_wait_seconds = 0;    // blocked in receives (activations, gradients, the loss)
  double allreduce_wait_seconds = 0;  // the Reducers' wait after the last backward
  int64_t bytes_sent = 0;             // point to point, headers included
  int64_t bytes_received = 0;
  // The share of the step this stage did not compute: 1 - (forward_seconds +
  // backward_seconds) / step_seconds (StepTelemetry.bubble_fraction's definition). On balanced
  // stages with free messages it is the ideal (S - 1) / (v M + S - 1) of IdealBubbleFraction.
  // The idle time is the receive waits (the bubble proper), the sends and the allreduce wait.
  double bubble_fraction = 0;
  // The most bytes that in-flight micro-batches held at once: the sum, over the (micro-batch,
  // chunk) pairs whose forward ran and whose backward has not, of what each forward left
  // allocated (its saved activations, its input and its output; allocation_counter.h). -1
  // when a profiler held the allocators' hook.
  int64_t peak_activation_bytes = 0;
  int peak_in_flight = 0;  // (micro-batch, chunk) pairs
};

class PipelineStage {
 public:
  // `group`: every rank of the job (layout.world_size() ranks); this rank is group->rank().
  // `chunks`: options.chunks_per_stage of them. `loss`: required on the last stage. Throws
  // std::invalid_argument naming what is wrong (ValidatePipelineShape's checks, a missing
  // forward, loss or DistributedDataParallel, a group of the wrong size).
  PipelineStage(std::shared_ptr<ProcessGroup> group, const PipelineLayout& layout,
                PipelineStageOptions options, std::vector<StageChunk> chunks,
                LossFunction loss = nullptr);
  ~PipelineStage();
  PipelineStage(const PipelineStage&) = delete;
  PipelineStage& operator=(const PipelineStage&) = delete;

  // One step (see the header). Throws CommError when a neighbour failed or timed out.
  StageStepReport Step(const StepBatch& batch, const StepControl& control = {});

  int stage() const { return layout_.StageOf(group_->rank()); }
  bool is_first() const { return stage() == 0; }
  bool is_last() const { return stage() == layout_.stages() - 1; }
  const std::vector<StageAction>& actions() const { return actions_; }

 private:
  class StepRun;

  const std::shared_ptr<ProcessGroup> group_;
  const PipelineLayout layout_;
  const PipelineStageOptions options_;
  const std::vector<StageChunk> chunks_;
  const LossFunction loss_;
  const std::vector<StageAction> actions_;
  // Per action: whether it is its chunk's last backward, the one gradient sync arms.
  const std::vector<bool> last_backward_of_chunk_;
  // Per micro-batch: the gradient receives posted before its activation is sent.
  const std::vector<std::vector<int>> gradients_ahead_;
  const std::shared_ptr<StageTraffic> traffic_;
};

}  // namespace gradhub::ddp::pipeline
