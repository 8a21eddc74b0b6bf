// How one rank's gradients become its next parameters: the optimizer (or its ZeRO shard), the
// learning rate, clipping, FP16's loss scaler, local SGD's parameter averaging and the
// gradient sync's comm hook (PowerSGD's state); and their parts of a checkpoint. The one owner of
// these, so a training loop (trainer.cc, a pipeline stage, a Python front end) asks it instead of
// branching on the features the spec turned on.
//
// The protocol, on every rank of the group, in the same order:
//   1. UpdateRule(module, group, plan): the module already on its training device, so the
//      optimizer's state (momentum, moments) is made there.
//   2. Resume, if there is a checkpoint: RestoreState (checkpoint_state.h) with shared_state().
//   3. ddp::DistributedDataParallel over the module with GradientSyncOptions(), whose comm
//      hook the rule keeps (its state goes into checkpoints); after a resume,
//      RestoreRankState (after DDP's broadcast of rank 0's parameters: a local SGD replica
//      gets its own back).
//   4. Each step: SyncsGradients(step) says whether the backward runs under DDP's NoSync;
//      the backward is of LossForBackward(loss); then Step(step) updates the parameters.
//   5. A checkpoint: shared_state() once (rank 0), SaveRankState() on every rank when the plan
//      has per-rank state.
// Not thread-safe: the training thread drives it. Step() and RestoreRankState() are
// collectives where ZeRO or local SGD take part.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "gpu_worker/ddp/distributed_data_parallel.h"
#include "gpu_worker/ddp/mixed_precision.h"
#include "gpu_worker/ddp/model_averager.h"
#include "gpu_worker/ddp/zero_redundancy_optimizer.h"
#include "gpu_worker/trainer/checkpoint_state.h"
#include "gpu_worker/trainer/training_plan.h"

namespace gradhub::trainer {

// precision FP16: the loss scale after the last step, and the steps skipped so far.
struct LossScaleStatus {
  double scale = 0;
  int64_t skipped_steps = 0;
};

struct StepOutcome {
  double learning_rate = 0;
  bool skipped = false;        // FP16: a gradient overflowed; the parameters did not change
  int64_t averaged_bytes = 0;  // local SGD: parameters allreduced after the step
};

class UpdateRule {
 public:
  // `module`'s parameters are the ones updated; `group` the ranks that share them, or with
  // pipeline stages the world group (clipping takes the norm over every stage).
  // `loss_scaler`: precision FP16's scaler settings (GradScaler's defaults unless a test
  // asks otherwise); unused for other precisions.
  UpdateRule(std::shared_ptr<torch::nn::Module> module, std::shared_ptr<ddp::ProcessGroup> group,
             const TrainingPlan& plan, ddp::LossScalerOptions loss_scaler = {});
  ~UpdateRule();

  // --- gradient sync (step 3) ---
  // The Reducer's settings: buckets, unused parameters, and the comm hook. For one DDP: a
  // hook with state (PowerSGD) serves one Reducer.
  ddp::DdpOptions GradientSyncOptions() const;

  // --- a step (step 4) ---
  // False for a local SGD step after warm-up: nothing is sent, the replicas drift apart
  // until the next average.
  bool SyncsGradients(int64_t step) const;
  // FP16: the loss times the scale (gradients of small magnitude would underflow float16).
  at::Tensor LossForBackward(const at::Tensor& loss) const;
  // After the backward (step 0-based): the learning rate of the step (TrainingFailure if it
  // overflows float32); FP16: unscale, skip the step if a gradient overflowed; clip (with
  // pipeline stages to the norm over all stages: a collective of the world group); step the
  // optimizer (ZeRO: its shard, then every owner broadcasts); local SGD: average at a period's
  // end.
  StepOutcome Step(int64_t step);

  // --- checkpoint (steps 2, 3 and 5) ---
  SharedUpdateState shared_state();
  std::string SaveRankState();
  // Throws std::runtime_error for empty `bytes` (a checkpoint without this rank's state).
  void RestoreRankState(const std::string& bytes, int64_t step, const c10::Device& device);

  // --- reporting ---
  std::optional<LossScaleStatus> loss_scale() const;
  // Of the optimizer state this rank holds (ZeRO: its shard's).
  int64_t optimizer_state_bytes() const;

 private:
  // The optimizer whose learning rate is set and whose state this rank holds.
  torch::optim::Optimizer& LocalOptimizer() const;
  RankStateParts RankState();
  void ClipGradients();

  const TrainingPlan plan_;
  std::shared_ptr<torch::nn::Module> module_;
  const std::shared_ptr<ddp::ProcessGroup> group_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;  // null with ZeRO
  std::unique_ptr<ddp::ZeroRedundancyOptimizer> zero_;
  std::unique_ptr<ddp::PeriodicModelAverager> averager_;  // localSgd
  // precision FP16 only: the same state on every rank, which skip the same steps.
  std::optional<ddp::LossScaler> scaler_;
  // The spec's commHook (null: plain allreduce), shared with the gradient sync's Reducer.
  const std::shared_ptr<ddp::CommHook> comm_hook_;
};

}  // namespace gradhub::trainer
