#pragma once

#include <torch/nn/module.h>

#include <chrono>
#include <functional>
#include <memory>

#include "gpu_worker/ddp/comm/process_group.h"
#include "gpu_worker/ddp/reducer.h"

namespace gradhub::ddp {

struct DdpOptions {
  ReducerOptions reducer;
  // Copy rank 0's buffers (BatchNorm running statistics) to every rank before each forward,
  // as PyTorch does, so evaluation and checkpoints agree across ranks.
  bool broadcast_buffers = true;
};

// Phase times of the last micro-batch, for telemetry. `backward` excludes the time spent
// waiting for allreduces after the last gradient, which is `allreduce_wait`.
struct StepTimings {
  std::chrono::nanoseconds forward{0};
  std::chrono::nanoseconds backward{0};
  std::chrono::nanoseconds allreduce_wait{0};
};

// Data parallel training of one module over a process group (PyTorch's
// DistributedDataParallel). A step on every rank:
//
//   ddp.ZeroGrad();
//   at::Tensor loss = ddp.Forward([&] { return Loss(model->forward(x), y); });
//   ddp.Backward(loss);            // returns with gradients averaged over all ranks
//   optimizer.step();              // identical on every rank
//
// Gradient accumulation: run the first micro-batches inside `auto guard = ddp.NoSync();`
// (gradients accumulate locally, nothing is sent), then the last one outside it.
//
// Construction checks that every rank has the same parameters (names are not compared; shapes
// and dtypes are) and copies rank 0's parameters and buffers to all ranks. Not thread-safe.
class DistributedDataParallel {
 public:
  DistributedDataParallel(std::shared_ptr<torch::nn::Module> module,
                          std::shared_ptr<ProcessGroup> group, DdpOptions options = {});
  ~DistributedDataParallel();

  // Runs `forward` for one micro-batch, after synchronizing buffers, and arms gradient
  // synchronization for the backward of its result unless a NoSync guard is alive.
  at::Tensor Forward(const std::function<at::Tensor()>& forward);
  void Backward(const at::Tensor& loss);
  void ZeroGrad();

  class NoSyncGuard {
   public:
    explicit NoSyncGuard(DistributedDataParallel* ddp) : ddp_(ddp) { ddp_->sync_ = false; }
    ~NoSyncGuard() { ddp_->sync_ = true; }
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;

   private:
    DistributedDataParallel* ddp_;
  };
  [[nodiscard]] NoSyncGuard NoSync() { return NoSyncGuard(this); }

  torch::nn::Module& module() { return *module_; }
  ProcessGroup& group() { return *group_; }
  const StepTimings& last_timings() const { return timings_; }
  const ReductionStats& last_reduction() const { return reducer_->last_stats(); }
  // options.reducer.comm_hook; null without one. A hook with has_state() holds per-rank state
  // for checkpoints.
  CommHook* comm_hook() const { return reducer_->comm_hook(); }
  std::vector<std::vector<size_t>> bucket_assignment() const {
    return reducer_->bucket_assignment();
  }

 private:
  std::shared_ptr<torch::nn::Module> module_;
  std::shared_ptr<ProcessGroup> group_;
  DdpOptions options_;
  std::vector<at::Tensor> buffers_;
  std::unique_ptr<Reducer> reducer_;
  bool sync_ = true;
  bool armed_ = false;  // the last Forward armed the reducer
  StepTimings timings_;
};

// Throws std::invalid_argument on every rank, naming the first parameter whose shape or dtype
// differs from rank 0's (or the differing parameter count).
void VerifySameParameters(ProcessGroup& group, const std::vector<std::string>& names,
                          const std::vector<at::Tensor>& parameters);

// Copies rank `root`'s tensors to every rank, in place (without recording autograd), with one
// broadcast per dtype instead of one per tensor. A no-op alone or without tensors.
void BroadcastCoalesced(ProcessGroup& group, const std::vector<at::Tensor>& tensors, int root);

}  // namespace gradhub::ddp
