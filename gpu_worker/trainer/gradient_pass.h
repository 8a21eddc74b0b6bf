// One optimizer step's forward and backward on a rank, with its gradients averaged over the
// ranks that hold the same parameters: what the training loop (trainer.cc) runs between
// zeroing the gradients and the update rule's step. Two kinds:
//   data parallel  the whole model under one DistributedDataParallel over every rank
//                  (data_parallel_pass.h);
//   pipelined      the rank's stage of the model, activations and gradients passed point to
//                  point between stages, each stage's gradients averaged over its replicas
//                  (pipeline_training.h).
// Built once a resumed model is restored (DDP copies rank 0's parameters to the others).
// Not thread-safe: the training thread drives it. Run and Evaluate are collectives: every rank
// calls them at the same steps.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "gpu_worker/data/batch_loader.h"
#include "gpu_worker/trainer/forward_pass.h"
#include "gpu_worker/trainer/sinks.h"

namespace gradhub::trainer {

class GradientPass {
 public:
  virtual ~GradientPass() = default;

  virtual void ZeroGrad() = 0;
  // The step's gradAccumulationSteps batches from `loader`: forward, loss and backward of
  // each, gradients averaged at the last when `sync` (false: local SGD's local steps). The
  // backward is of `loss_for_backward` of each batch's loss divided by the batches (FP16:
  // scaled). Returns the step's mean loss (float64 on the training device; zero on a
  // pipeline's stages that do not see it) and adds to `report` the phases' seconds, the
  // gradient allreduce's bytes, seconds and buckets, and a pipeline's figures.
  virtual at::Tensor Run(data::BatchLoader& loader, bool sync, StepReport& report) = 0;
  // The validation metrics, the same on every rank. Leaves the model in training mode.
  virtual EvalResult Evaluate(const std::vector<int64_t>& validation) = 0;
};

}  // namespace gradhub::trainer
