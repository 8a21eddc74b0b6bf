// PowerSGD gradient compression for the Reducer's buckets (Vogels et al., "PowerSGD: Practical
// Low-Rank Gradient Compression for Distributed Optimization", NeurIPS 2019; PyTorch's
// torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "gpu_worker/ddp/comm/process_group.h"

namespace torch::serialize {
class OutputArchive;
class InputArchive;
}  // namespace torch::serialize

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

// One bucket's compressed allreduce, in two halves so the first overlaps backward.
//
// Launch (when the bucket's gradients are ready, in bucket order on every rank):
//   1. Error feedback: add each compressed gradient's stored error; remember the sum M.
//   2. Split the bucket's gradients: matrices (a tensor viewed as [shape[0], rest]) that pass
//      the compression test, and the rest, copied into one flat buffer.
//   3. For each matrix M (n x m): Q (m x r) is last step's Q orthonormalized (warm start), or
//      a Gaussian seeded by (seed, parameter, step), orthonormalized; P = M Q into one flat
//      buffer of every matrix's P.
//   4. Start two allreduces: the uncompressed buffer, then the P buffer.
// Finish (in Finalize, in bucket order on every rank):
//   5. Wait; the uncompressed gradients get their average.
//   6. Orthonormalize each P (Gram-Schmidt over its r columns); Q = M^T P into one flat buffer;
//      allreduce it and divide by world size.
//   7. Each gradient becomes P Q^T (the same on every rank), the error M - P Q^T is stored,
//      and Q is kept for the warm start.
// A step sends (n + m) r instead of n m elements per compressed matrix. Error and Q are kept
// per parameter, not per bucket, so they survive the Reducer's bucket rebuild and go into
// checkpoints whatever the bucket layout. A zero P column stays zero (where PyTorch divides
// by a zero norm and gets NaN).
// Not thread-safe: the Reducer calls it from its one training thread.
class PowerSgd {
 public:
  struct Pending;

  PowerSgd(std::vector<at::Tensor> parameters, std::shared_ptr<ProcessGroup> group,
           PowerSgdOptions options);
  ~PowerSgd();

  // True once start_iter synchronized steps have been reduced: buckets are then compressed.
  bool active() const { return iter_ >= options_.start_iter; }
  // Steps 1-4 for the bucket holding `indices`, whose gradients are `grads` (views into the
  // bucket). Adds the elements sent so far to *bytes.
  std::shared_ptr<Pending> Launch(const std::vector<size_t>& indices,
                                  const std::vector<at::Tensor>& grads, int64_t* bytes);
  // Steps 5-7. Throws CommError as the allreduces do.
  void Finish(Pending& pending, int64_t* bytes);
  // After every synchronized step (compressed or not).
  void EndStep() { ++iter_; }

  int64_t iter() const { return iter_; }
  // For checkpoints: the step count, every stored error and Q, keyed by parameter index.
  void Save(torch::serialize::OutputArchive& archive) const;
  void Load(torch::serialize::InputArchive& archive);

 private:
  bool Compresses(const at::Tensor& parameter) const;
  at::Tensor InitialQ(size_t index, int64_t rows, int64_t rank) const;

  std::vector<at::Tensor> parameters_;
  std::shared_ptr<ProcessGroup> group_;
  PowerSgdOptions options_;
  int64_t iter_ = 0;
  std::map<size_t, at::Tensor> errors_;  // by parameter index, [n, m]
  std::map<size_t, at::Tensor> qs_;      // by parameter index, [m, r]
};

}  // namespace gradhub::ddp
