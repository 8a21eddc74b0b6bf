// How the Reducer communicates a bucket of gradients: an open interface (c10d's
// register_comm_hook with its state), with the FP16 and BF16 casts here and PowerSGD in
// powersgd.h as implementations. Without a hook the Reducer averages each bucket with one
// allreduce.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gpu_worker/ddp/comm/process_group.h"

namespace torch::serialize {
class OutputArchive;
class InputArchive;
}  // namespace torch::serialize

namespace gradhub::ddp {

// One bucket of gradients as the Reducer hands it to a hook (c10d's GradBucket).
struct GradBucket {
  // Position in launch order: the same bucket has the same index on every rank.
  size_t index = 0;
  // The bucket's gradients, flat, of one dtype. Every parameter's .grad is a view into it, so
  // what a hook leaves here is what the optimizer reads.
  at::Tensor buffer;
  // The bucket's parameters (indices in the module's registration order), in buffer order.
  std::vector<size_t> parameters;
  // Their gradients: views into `buffer`, each shaped like its parameter.
  std::vector<at::Tensor> gradients;
};

// What one bucket's reduction took, for ReductionStats.
struct ReductionCost {
  using Clock = std::chrono::steady_clock;
  Clock::time_point start{};  // its first collective started
  Clock::time_point end{};    // its last collective ended
  int64_t bytes = 0;          // sent into collectives
};

// One bucket's reduction in flight, as a hook started it.
class PendingReduction {
 public:
  virtual ~PendingReduction() = default;
  // Blocks until the bucket's buffer holds the reduced gradients (the same on every rank);
  // may run further collectives. Throws CommError as the collectives do.
  virtual ReductionCost Finish() = 0;
};

// The reduction without a hook: one allreduce (kAverage) of `buffer`, in place.
std::unique_ptr<PendingReduction> AllReduceAverage(ProcessGroup& group, const at::Tensor& buffer);

// A bucket's communication, replaceable (compression, a custom schedule).
//
// Protocol, driven by the Reducer identically on every rank:
//  1. Launch(bucket, group) for each bucket in bucket order, as soon as its gradients are
//     ready (while backward still runs). Every rank must issue the same collectives for the
//     same bucket.
//  2. Finish() of what Launch returned, for each bucket in bucket order, after backward.
//  3. EndStep() after every synchronized step, also in a world of one (where 1 and 2 are
//     skipped: the local gradient is the average).
// A hook whose state outlives a step (PowerSGD's error feedback and Q) keeps it by parameter
// index, not by bucket, so it survives the Reducer's bucket rebuild, and says so with
// has_state(): that state is per rank and belongs in checkpoints (Save, Load).
//
// A hook with state serves one Reducer: give each rank its own. Not thread-safe: the Reducer
// calls it from its training loop's thread and that loop's autograd thread, never at once.
// (A stateless hook such as CastCompressHook may be shared by the Reducers of several ranks.)
class CommHook {
 public:
  virtual ~CommHook() = default;

  // Names the hook in logs, and its state in checkpoints: "fp16", "bf16", "powersgd".
  virtual std::string name() const = 0;
  // Step 1.
  virtual std::unique_ptr<PendingReduction> Launch(const GradBucket& bucket,
                                                   ProcessGroup& group) = 0;
  // Step 3.
  virtual void EndStep() {}

  // Whether Save and Load carry state; the defaults save nothing.
  virtual bool has_state() const { return false; }
  virtual void Save(torch::serialize::OutputArchive& /*archive*/) const {}
  virtual void Load(torch::serialize::InputArchive& /*archive*/) {}
};

// Divides the bucket by the world size, casts it to `dtype` (float16 or bfloat16), sums that
// across ranks and casts back: half the bytes of float32 (PyTorch's fp16_compress_hook and
// bf16_compress_hook). Dividing first keeps a 16-bit sum from overflowing where the average
// would not. Stateless.
class CastCompressHook final : public CommHook {
 public:
  // Throws std::invalid_argument for a dtype other than float16 or bfloat16.
  explicit CastCompressHook(at::ScalarType dtype);

  std::string name() const override;
  std::unique_ptr<PendingReduction> Launch(const GradBucket& bucket, ProcessGroup& group) override;

 private:
  const at::ScalarType dtype_;
};

}  // namespace gradhub::ddp
