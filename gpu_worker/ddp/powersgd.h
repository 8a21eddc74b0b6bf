// PowerSGD gradient compression for the Reducer's buckets (Vogels et al., "PowerSGD: Practical
// Low-Rank Gradient Compression for Distributed Optimization", NeurIPS 2019; PyTorch's
// torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gpu_worker/ddp/comm_hook.h"

namespace gradhub::ddp {

struct PowerSgdOptions {
  // Rank r of the approximation M ~ P Q^T: lower sends less and loses more.
  int64_t matrix_approximation_rank = 1;
  // Synchronized steps reduced uncompressed before compression starts (PyTorch's
  // start_powerSGD_iter): early gradients change fast, and the error they leave is large.
  int64_t start_iter = 10;
  // A gradient is compressed only when (n + m) r * min_compression_rate < n m; others (biases,
  // every 1-D tensor, small matrices) are allreduced uncompressed.
  double min_compression_rate = 2;
  // Add the last step's local compression error to this step's gradient (error feedback):
  // without it PowerSGD does not converge to what SGD does.
  bool error_feedback = true;
  // Start each step's power iteration from the last step's Q instead of a random one.
  bool warm_start = true;
  // Seeds the random initial Q, the same on every rank.
  uint64_t seed = 0;
};

// PowerSGD as a comm hook: one bucket's compressed allreduce, in two halves so the first
// overlaps backward.
//
// Launch (when the bucket's gradients are ready, in bucket order on every rank); before
// start_iter synchronized steps have passed, a plain allreduce (average) instead:
//   1. Error feedback: add each compressed gradient's stored error; remember the sum M.
//   2. Split the bucket's gradients: matrices (a tensor viewed as [shape[0], rest]) that pass
//      the compression test, and the rest, copied into one flat buffer.
//   3. For each matrix M (n x m): Q (m x r) is last step's Q orthonormalized (warm start), or
//      a Gaussian seeded by (seed, parameter, step), orthonormalized; P = M Q into one flat
//      buffer of every matrix's P.
//   4. Start two allreduces: the uncompressed buffer, then the P buffer.
// Finish (in Reducer::Finalize, in bucket order on every rank):
//   5. Wait; the uncompressed gradients get their average.
//   6. Orthonormalize each P (Gram-Schmidt over its r columns); Q = M^T P into one flat buffer;
//      allreduce it and divide by world size.
//   7. Each gradient becomes P Q^T (the same on every rank), the error M - P Q^T is stored,
//      and Q is kept for the warm start.
// A step sends (n + m) r instead of n m elements per compressed matrix. Error and Q are kept
// per parameter, not per bucket, so they survive the Reducer's bucket rebuild and go into
// checkpoints whatever the bucket layout (has_state: per rank). A zero P column stays zero
// (where PyTorch divides by a zero norm and gets NaN).
// Not thread-safe (see CommHook).
class PowerSgdHook final : public CommHook {
 public:
  // Throws std::invalid_argument for options out of range.
  explicit PowerSgdHook(PowerSgdOptions options);
  ~PowerSgdHook() override;

  std::string name() const override { return "powersgd"; }
  // Steps 1-4; the returned reduction's Finish runs steps 5-7.
  std::unique_ptr<PendingReduction> Launch(const GradBucket& bucket, ProcessGroup& group) override;
  // After every synchronized step (compressed or not).
  void EndStep() override { ++iter_; }

  // True once start_iter synchronized steps have been reduced: buckets are then compressed.
  bool active() const { return iter_ >= options_.start_iter; }
  int64_t iter() const { return iter_; }

  // For checkpoints: the step count, every stored error and Q, keyed by parameter index.
  bool has_state() const override { return true; }
  void Save(torch::serialize::OutputArchive& archive) const override;
  void Load(torch::serialize::InputArchive& archive) override;

 private:
  class Reduction;

  bool Compresses(const at::Tensor& gradient) const;
  at::Tensor InitialQ(size_t index, int64_t rows, int64_t rank) const;
  // Step 3 of `reduction`: each matrix's Q, and P = M Q.
  void ProjectOntoQ(Reduction& reduction) const;
  // Steps 5-7 of `reduction`.
  ReductionCost Finish(Reduction& reduction);

  PowerSgdOptions options_;
  int64_t iter_ = 0;
  std::map<size_t, at::Tensor> errors_;  // by parameter index, [n, m]
  std::map<size_t, at::Tensor> qs_;      // by parameter index, [m, r]
};

}  // namespace gradhub::ddp
