#pragma once

#include <torch/nn/cloneable.h>
#include <torch/nn/pimpl.h>

#include <memory>

#include "gpu_worker/ddp/comm/process_group.h"

namespace gradhub::ddp {

struct SyncBatchNormOptions {
  int64_t num_features = 0;
  double eps = 1e-5;
  double momentum = 0.1;
  bool affine = true;
};

// Batch normalization whose training statistics cover the global batch: every rank's
// per-channel count, mean and M2 are gathered and combined (Chan's parallel variance), and
// backward reduces the two per-channel sums that the input gradient needs. With it, DDP at
// world size N computes exactly what one process computes on the concatenated batch; plain
// BatchNorm would normalize each rank's batch on its own.
//
// Input [batch, channels, ...]. Without a group (or with one of size 1) it is ordinary
// BatchNorm, so one model definition serves every world size. In eval mode it uses the
// running statistics, which are identical on all ranks.
class SyncBatchNormImpl : public torch::nn::Cloneable<SyncBatchNormImpl> {
 public:
  SyncBatchNormImpl(SyncBatchNormOptions options, std::shared_ptr<ProcessGroup> group);
  void reset() override;
  at::Tensor forward(const at::Tensor& input);

  at::Tensor weight, bias, running_mean, running_var, num_batches_tracked;

 private:
  SyncBatchNormOptions options_;
  std::shared_ptr<ProcessGroup> group_;
};
TORCH_MODULE(SyncBatchNorm);

}  // namespace gradhub::ddp
