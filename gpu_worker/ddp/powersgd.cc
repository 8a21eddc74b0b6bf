#include "gpu_worker/ddp/powersgd.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/serialize/archive.h>

#include <algorithm>
#include <stdexcept>
#include <string>

namespace gradhub::ddp {

namespace {

at::Tensor AsMatrix(const at::Tensor& tensor) {
  return tensor.dim() == 0 ? tensor.reshape({1, 1}) : tensor.view({tensor.size(0), -1});
}

// Gram-Schmidt over the columns of `matrix` (n x r), in place.
void Orthonormalize(at::Tensor matrix) {
  const int64_t columns = matrix.size(1);
  for (int64_t i = 0; i < columns; ++i) {
    at::Tensor column = matrix.narrow(1, i, 1);
    column.div_(column.norm().clamp_min(1e-30));
    if (i + 1 < columns) {
      at::Tensor rest = matrix.narrow(1, i + 1, columns - i - 1);
      rest.sub_((column * rest).sum(0, /*keepdim=*/true) * column);
    }
  }
}

int64_t ApproximationRank(const at::Tensor& matrix, int64_t rank) {
  return std::min({matrix.size(0), matrix.size(1), rank});
}

}  // namespace

// One bucket's reduction between Launch and Finish.
class PowerSgdHook::Reduction final : public PendingReduction {
 public:
  struct Matrix {
    size_t index;
    at::Tensor m;      // the gradient viewed [n, m]; after Finish, P Q^T
    at::Tensor input;  // a copy of M before compression, for the error
    at::Tensor p, q;   // views into the flat P and Q buffers
  };

  Reduction(PowerSgdHook& hook, ProcessGroup& group) : hook(hook), group(group) {}
  ReductionCost Finish() override { return hook.Finish(*this); }

  PowerSgdHook& hook;  // outlives this: the Reducer holds both
  ProcessGroup& group;
  ReductionCost cost;
  std::vector<Matrix> matrices;
  std::vector<at::Tensor> uncompressed;  // gradient views
  at::Tensor uncompressed_flat, p_flat, q_flat;
  std::shared_ptr<Work> uncompressed_work, p_work;
};

PowerSgdHook::PowerSgdHook(PowerSgdOptions options) : options_(options) {
  if (options_.matrix_approximation_rank < 1 || options_.start_iter < 0 ||
      options_.min_compression_rate < 1) {
    throw std::invalid_argument(
        "PowerSgdHook: needs matrix_approximation_rank >= 1, start_iter >= 0 and "
        "min_compression_rate >= 1");
  }
}

PowerSgdHook::~PowerSgdHook() = default;

bool PowerSgdHook::Compresses(const at::Tensor& gradient) const {
  if (gradient.dim() < 2) return false;
  const int64_t n = gradient.size(0), m = gradient.numel() / n;
  const int64_t r = std::min({n, m, options_.matrix_approximation_rank});
  return static_cast<double>((n + m) * r) * options_.min_compression_rate <
         static_cast<double>(n * m);
}

at::Tensor PowerSgdHook::InitialQ(size_t index, int64_t rows, int64_t rank) const {
  // A pure function of (seed, parameter, step): every rank draws the same, in any bucket order.
  const uint64_t seed = options_.seed * 0x9e3779b97f4a7c15ULL + index * 0xbf58476d1ce4e5b9ULL +
                        static_cast<uint64_t>(iter_);
  at::Generator generator = at::detail::createCPUGenerator(seed);
  return at::randn({rows, rank}, generator, at::kFloat);
}

std::unique_ptr<PendingReduction> PowerSgdHook::Launch(const GradBucket& bucket,
                                                       ProcessGroup& group) {
  if (!active()) return AllReduceAverage(group, bucket.buffer);
  auto reduction = std::make_unique<Reduction>(*this, group);
  reduction->cost.start = ReductionCost::Clock::now();
  // Steps 1 and 2.
  int64_t p_size = 0, q_size = 0;
  for (size_t i = 0; i < bucket.parameters.size(); ++i) {
    const at::Tensor& grad = bucket.gradients[i];
    if (!Compresses(grad)) {
      reduction->uncompressed.push_back(grad);
      continue;
    }
    Reduction::Matrix matrix{bucket.parameters[i], AsMatrix(grad), {}, {}, {}};
    if (options_.error_feedback) {
      auto error = errors_.find(matrix.index);
      if (error != errors_.end()) matrix.m.add_(error->second);
      matrix.input = matrix.m.clone();
    }
    const int64_t r = ApproximationRank(matrix.m, options_.matrix_approximation_rank);
    p_size += matrix.m.size(0) * r;
    q_size += matrix.m.size(1) * r;
    reduction->matrices.push_back(std::move(matrix));
  }
  reduction->p_flat = at::empty({p_size}, bucket.buffer.options());
  reduction->q_flat = at::empty({q_size}, bucket.buffer.options());
  ProjectOntoQ(*reduction);
  // Step 4.
  Reduction& r = *reduction;
  if (!r.uncompressed.empty()) {
    std::vector<at::Tensor> flat_parts;
    for (const at::Tensor& grad : r.uncompressed) flat_parts.push_back(grad.reshape({-1}));
    r.uncompressed_flat = at::cat(flat_parts);
    r.uncompressed_work = group.AllReduce(r.uncompressed_flat, ReduceOp::kAverage);
    r.cost.bytes += r.uncompressed_flat.nbytes();
  }
  if (p_size > 0) {
    r.p_work = group.AllReduce(r.p_flat, ReduceOp::kSum);
    r.cost.bytes += r.p_flat.nbytes();
  }
  return reduction;
}

void PowerSgdHook::ProjectOntoQ(Reduction& reduction) const {
  // Step 3.
  int64_t p_offset = 0, q_offset = 0;
  for (Reduction::Matrix& matrix : reduction.matrices) {
    const int64_t n = matrix.m.size(0), m = matrix.m.size(1);
    const int64_t r = ApproximationRank(matrix.m, options_.matrix_approximation_rank);
    matrix.p = reduction.p_flat.narrow(0, p_offset, n * r).view({n, r});
    matrix.q = reduction.q_flat.narrow(0, q_offset, m * r).view({m, r});
    p_offset += n * r;
    q_offset += m * r;
    auto kept = qs_.find(matrix.index);
    if (options_.warm_start && kept != qs_.end()) {
      matrix.q.copy_(kept->second);
    } else {
      matrix.q.copy_(InitialQ(matrix.index, m, r));
    }
    Orthonormalize(matrix.q);
    at::matmul_out(matrix.p, matrix.m, matrix.q);
  }
}

ReductionCost PowerSgdHook::Finish(Reduction& r) {
  // Step 5.
  if (r.uncompressed_work) {
    r.uncompressed_work->Wait();
    int64_t offset = 0;
    for (at::Tensor& grad : r.uncompressed) {
      grad.copy_(r.uncompressed_flat.narrow(0, offset, grad.numel()).view(grad.sizes()));
      offset += grad.numel();
    }
  }
  if (r.p_work) {
    r.p_work->Wait();
    // Step 6.
    for (Reduction::Matrix& matrix : r.matrices) {
      Orthonormalize(matrix.p);
      at::matmul_out(matrix.q, matrix.m.t(), matrix.p);
    }
    r.group.AllReduce(r.q_flat, ReduceOp::kAverage)->Wait();
    r.cost.bytes += r.q_flat.nbytes();
    // Step 7.
    for (Reduction::Matrix& matrix : r.matrices) {
      at::matmul_out(matrix.m, matrix.p, matrix.q.t());
      if (options_.error_feedback) errors_[matrix.index] = matrix.input - matrix.m;
      if (options_.warm_start) qs_[matrix.index] = matrix.q.clone();
    }
  }
  r.cost.end = ReductionCost::Clock::now();
  return r.cost;
}

void PowerSgdHook::Save(torch::serialize::OutputArchive& archive) const {
  archive.write("iter", at::tensor(iter_));
  for (const auto& [index, error] : errors_) archive.write("error_" + std::to_string(index), error);
  for (const auto& [index, q] : qs_) archive.write("q_" + std::to_string(index), q);
}

void PowerSgdHook::Load(torch::serialize::InputArchive& archive) {
  at::Tensor iter;
  archive.read("iter", iter);
  iter_ = iter.item<int64_t>();
  errors_.clear();
  qs_.clear();
  for (const std::string& key : archive.keys()) {
    // "error_<index>", "q_<index>". A fresh tensor for each read: reading into a defined
    // tensor set_()s it in place, which would change the one stored before.
    const bool error = key.rfind("error_", 0) == 0;
    if (!error && key.rfind("q_", 0) != 0) continue;
    const size_t index = std::stoul(key.substr(key.find('_') + 1));
    at::Tensor value;
    archive.read(key, value);
    (error ? errors_ : qs_)[index] = value;
  }
}

}  // namespace gradhub::ddp
