// Post-local SGD: periodic model averaging instead of a gradient allreduce at every step
// (Lin et al., "Don't Use Large Mini-Batches, Use Local SGD", ICLR 2020; PyTorch's
// PostLocalSGDOptimizer with a PeriodicModelAverager).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "gpu_worker/ddp/comm/process_group.h"

namespace gradhub::ddp {

struct LocalSgdOptions {
  // Synchronous DDP steps (gradients averaged every step) before local steps begin; a model
  // far from any minimum needs them to converge (Lin et al.).
  int64_t warmup_steps = 0;
  // After warm-up, parameters are averaged after every `period`-th local step. 1 = every step
  // synchronizes its gradients: plain DDP, bit for bit (averaging parameters after every step
  // would equal it only in exact arithmetic, and not at all for Adam).
  int64_t period = 1;
};

// Decides, per optimizer step, whether gradients are allreduced (synchronous) or the step is
// local, and averages the parameters across ranks when a period ends.
//
// Step `step` (0-based, as the trainer counts):
//   1. Synchronous(step): step < warmup_steps, or period is 1. Then DDP averages gradients as
//      usual and nothing else happens.
//   2. Otherwise the caller runs the step's backward under DDP's NoSync (no collective), and
//      every rank's optimizer steps on its own gradients.
//   3. AfterStep(step): when (step - warmup_steps + 1) is a multiple of period, every
//      parameter is replaced by its average across ranks (one allreduce per dtype, over a flat
//      copy). So the ranks agree again after each period's last step and at no other time.
// What is given up against DDP: between averages, replicas differ, so the model is an average
// of models trained on each rank's shard rather than one model trained on the global batch;
// optimizer state (momentum, Adam moments) is never averaged and stays per rank, as in
// PyTorch. What is gained: one parameter allreduce per period instead of one gradient
// allreduce per step.
// Not thread-safe; AfterStep is a collective on averaging steps (every rank calls it every step).
class PeriodicModelAverager {
 public:
  PeriodicModelAverager(std::vector<at::Tensor> parameters, std::shared_ptr<ProcessGroup> group,
                        LocalSgdOptions options);

  bool Synchronous(int64_t step) const;
  // Returns the bytes allreduced (0 when the step did not end a period).
  int64_t AfterStep(int64_t step);
  bool AveragesAfter(int64_t step) const;

 private:
  std::vector<at::Tensor> parameters_;
  std::shared_ptr<ProcessGroup> group_;
  LocalSgdOptions options_;
};

}  // namespace gradhub::ddp
