#pragma once

#include <ATen/core/Tensor.h>
#include <torch/optim/optimizer.h>

#include <memory>
#include <vector>

#include "gradhub/v1/jobs.pb.h"

namespace gradhub::trainer {

// torch.optim's SGD, Adam or AdamW with the spec's settings and PyTorch's defaults for what
// it leaves unset.
std::unique_ptr<torch::optim::Optimizer> BuildOptimizer(const v1::OptimizerSpec& spec,
                                                        std::vector<at::Tensor> parameters);

// The learning rate for optimizer step `step` (0-based): the schedule applied to the
// optimizer's lr, times (step + 1) / warmup_steps while warming up. A pure function of the
// step, so a resumed run needs no scheduler state.
double LearningRateAt(const v1::JobSpec& spec, int64_t step);

void SetLearningRate(torch::optim::Optimizer& optimizer, double learning_rate);

}  // namespace gradhub::trainer
