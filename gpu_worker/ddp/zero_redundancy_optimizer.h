// Optimizer state sharded across ranks (ZeRO stage 1; PyTorch's ZeroRedundancyOptimizer).
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "gpu_worker/ddp/comm/process_group.h"

namespace gradhub::ddp {

// The rank that owns each parameter, by index: parameters sorted by size, largest first (a
// stable sort), each given to the rank with the fewest elements so far, the lowest such rank
// on a tie (PyTorch's ZeroRedundancyOptimizer._partition_parameters). A pure function of the
// shapes and the world size, so every rank computes the same owners without talking.
std::vector<int> PartitionParameters(const std::vector<at::Tensor>& parameters, int world_size);

// Bytes of optimizer state tensors (SGD's momentum buffers, Adam's and AdamW's moments and
// max_exp_avg_sq) that `optimizer` holds; 0 for state kinds it does not know.
int64_t OptimizerStateBytes(const torch::optim::Optimizer& optimizer);

using OptimizerFactory =
    std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<at::Tensor> parameters)>;

// Each rank keeps optimizer state for, and updates, only the parameters it owns (1/world of
// the elements, by PartitionParameters); after the step each owner broadcasts its parameters,
// so all ranks again hold the same full model. Gradients are still allreduced in full by DDP
// (stage 1: states sharded, gradients and parameters not).
//
// One step, on every rank, after DDP's Backward averaged the gradients:
//   1. the local optimizer (made by `make_local` over this rank's parameters only) steps;
//   2. for r = 0 .. world-1: rank r broadcasts its parameters, as one transfer.
// Element-wise optimizers (SGD, Adam, AdamW) compute per parameter exactly what one optimizer
// over all parameters computes, so the parameters equal plain DDP's. What is sharded is the
// optimizer's per-parameter state: SGD's momentum buffer (none without momentum: then only
// the step is split), Adam's two moments (and max_exp_avg_sq with amsgrad). The learning rate
// is set on local() (its param groups). A rank that owns no parameter (more ranks than
// parameters) still takes part in the broadcasts.
//
// Not thread-safe; Step() is a collective: every rank calls it, in the same order relative to
// its other collectives.
class ZeroRedundancyOptimizer {
 public:
  ZeroRedundancyOptimizer(std::vector<at::Tensor> parameters, std::shared_ptr<ProcessGroup> group,
                          const OptimizerFactory& make_local);

  void Step();

  // This rank's optimizer over its own parameters (learning rate, state, save/load).
  torch::optim::Optimizer& local() { return *local_; }
  const std::vector<int>& owners() const { return owners_; }
  int64_t local_state_bytes() const { return OptimizerStateBytes(*local_); }

 private:
  std::vector<at::Tensor> parameters_;
  std::shared_ptr<ProcessGroup> group_;
  std::vector<int> owners_;
  std::vector<std::vector<size_t>> by_owner_;  // parameter indices, in order
  std::unique_ptr<torch::optim::Optimizer> local_;
};

}  // namespace gradhub::ddp
