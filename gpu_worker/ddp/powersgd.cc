#include "gpu_worker/ddp/powersgd.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/serialize/archive.h>

#include <algorithm>
#include <stdexcept>
#include <string>

namespace gradhub::ddp {

struct PowerSgd::Pending {
  struct Matrix {
    size_t index;
    at::Tensor m;      // the gradient viewed [n, m]; after Finish, P Q^T
    at::Tensor input;  // a copy of M before compression, for the error
    at::Tensor p, q;   // views into the flat P and Q buffers
  };
  std::vector<Matrix> matrices;
  std::vector<at::Tensor> uncompressed;  // gradient views
  at::Tensor uncompressed_flat, p_flat, q_flat;
  std::shared_ptr<Work> uncompressed_work, p_work;
};

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

}  // namespace

PowerSgd::PowerSgd(std::vector<at::Tensor> parameters, std::shared_ptr<ProcessGroup> group,
                   PowerSgdOptions options)
    : parameters_(std::move(parameters)), group_(std::move(group)), options_(options) {
  if (options_.matrix_approximation_rank < 1 || options_.start_iter < 0 ||
      options_.min_compression_rate < 1) {
    throw std::invalid_argument(
        "PowerSgd: needs matrix_approximation_rank >= 1, start_iter >= 0 and "
        "min_compression_rate >= 1");
  }
}

PowerSgd::~PowerSgd() = default;

bool PowerSgd::Compresses(const at::Tensor& parameter) const {
  if (parameter.dim() < 2) return false;
  const int64_t n = parameter.size(0), m = parameter.numel() / n;
  const int64_t r = std::min({n, m, options_.matrix_approximation_rank});
  return static_cast<double>((n + m) * r) * options_.min_compression_rate <
         static_cast<double>(n * m);
}

at::Tensor PowerSgd::InitialQ(size_t index, int64_t rows, int64_t rank) const {
  // A pure function of (seed, parameter, step): every rank draws the same, in any bucket order.
  const uint64_t seed = options_.seed * 0x9e3779b97f4a7c15ULL + index * 0xbf58476d1ce4e5b9ULL +
                        static_cast<uint64_t>(iter_);
  at::Generator generator = at::detail::createCPUGenerator(seed);
  return at::randn({rows, rank}, generator, at::kFloat);
}

std::shared_ptr<PowerSgd::Pending> PowerSgd::Launch(const std::vector<size_t>& indices,
                                                    const std::vector<at::Tensor>& grads,
                                                    int64_t* bytes) {
  auto pending = std::make_shared<Pending>();
  int64_t p_size = 0, q_size = 0;
  for (size_t i = 0; i < indices.size(); ++i) {
    if (!Compresses(parameters_[indices[i]])) {
      pending->uncompressed.push_back(grads[i]);
      continue;
    }
    Pending::Matrix matrix{indices[i], AsMatrix(grads[i]), {}, {}, {}};
    if (options_.error_feedback) {
      auto error = errors_.find(matrix.index);
      if (error != errors_.end()) matrix.m.add_(error->second);
      matrix.input = matrix.m.clone();
    }
    p_size += matrix.m.size(0) *
              std::min({matrix.m.size(0), matrix.m.size(1), options_.matrix_approximation_rank});
    q_size += matrix.m.size(1) *
              std::min({matrix.m.size(0), matrix.m.size(1), options_.matrix_approximation_rank});
    pending->matrices.push_back(std::move(matrix));
  }
  const auto options = grads.empty() ? at::TensorOptions(at::kFloat) : grads[0].options();
  pending->p_flat = at::empty({p_size}, options);
  pending->q_flat = at::empty({q_size}, options);
  int64_t p_offset = 0, q_offset = 0;
  for (Pending::Matrix& matrix : pending->matrices) {
    const int64_t n = matrix.m.size(0), m = matrix.m.size(1);
    const int64_t r = std::min({n, m, options_.matrix_approximation_rank});
    matrix.p = pending->p_flat.narrow(0, p_offset, n * r).view({n, r});
    matrix.q = pending->q_flat.narrow(0, q_offset, m * r).view({m, r});
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
  if (!pending->uncompressed.empty()) {
    std::vector<at::Tensor> flat_parts;
    for (const at::Tensor& grad : pending->uncompressed) flat_parts.push_back(grad.reshape({-1}));
    pending->uncompressed_flat = at::cat(flat_parts);
    pending->uncompressed_work = group_->AllReduce(pending->uncompressed_flat, ReduceOp::kAverage);
    *bytes += pending->uncompressed_flat.nbytes();
  }
  if (p_size > 0) {
    pending->p_work = group_->AllReduce(pending->p_flat, ReduceOp::kSum);
    *bytes += pending->p_flat.nbytes();
  }
  return pending;
}

void PowerSgd::Finish(Pending& pending, int64_t* bytes) {
  if (pending.uncompressed_work) {
    pending.uncompressed_work->Wait();
    int64_t offset = 0;
    for (at::Tensor& grad : pending.uncompressed) {
      grad.copy_(pending.uncompressed_flat.narrow(0, offset, grad.numel()).view(grad.sizes()));
      offset += grad.numel();
    }
  }
  if (!pending.p_work) return;
  pending.p_work->Wait();
  for (Pending::Matrix& matrix : pending.matrices) {
    Orthonormalize(matrix.p);
    at::matmul_out(matrix.q, matrix.m.t(), matrix.p);
  }
  group_->AllReduce(pending.q_flat, ReduceOp::kAverage)->Wait();
  *bytes += pending.q_flat.nbytes();
  for (Pending::Matrix& matrix : pending.matrices) {
    at::matmul_out(matrix.m, matrix.p, matrix.q.t());
    if (options_.error_feedback) errors_[matrix.index] = matrix.input - matrix.m;
    if (options_.warm_start) qs_[matrix.index] = matrix.q.clone();
  }
}

void PowerSgd::Save(torch::serialize::OutputArchive& archive) const {
  archive.write("iter", at::tensor(iter_));
  for (const auto& [index, error] : errors_) archive.write("error_" + std::to_string(index), error);
  for (const auto& [index, q] : qs_) archive.write("q_" + std::to_string(index), q);
}

void PowerSgd::Load(torch::serialize::InputArchive& archive) {
  at::Tensor iter;
  archive.read("iter", iter);
  iter_ = iter.item<int64_t>();
  errors_.clear();
  qs_.clear();
  for (size_t index = 0; index < parameters_.size(); ++index) {
    // A fresh tensor for each read: reading into a defined tensor set_()s it in place, which
    // would change the one stored before.
    at::Tensor error, q;
    if (archive.try_read("error_" + std::to_string(index), error)) errors_[index] = error;
    if (archive.try_read("q_" + std::to_string(index), q)) qs_[index] = q;
  }
}

}  // namespace gradhub::ddp
