#include "gpu_worker/ddp/sync_batch_norm.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

namespace gradhub::ddp {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Per-channel statistics of one rank's batch, reduced over every dimension but 1.
std::vector<int64_t> ReducedDims(const at::Tensor& input) {
  std::vector<int64_t> dims = {0};
  for (int64_t d = 2; d < input.dim(); ++d) dims.push_back(d);
  return dims;
}

// Shape [1, C, 1, ...] for broadcasting a per-channel vector against the input.
std::vector<int64_t> ChannelShape(const at::Tensor& input) {
  std::vector<int64_t> shape(input.dim(), 1);
  shape[1] = input.size(1);
  return shape;
}

at::Tensor SumAcrossRanks(ProcessGroup* group, at::Tensor tensor) {
  if (group != nullptr && group->size() > 1) group->AllReduce(tensor, ReduceOp::kSum)->Wait();
  return tensor;
}

// Forward computes global statistics and normalizes; backward needs the global sums of dy and
// dy * x_hat. The group pointer rides in saved_data as an integer: the module that owns the
// group outlives every backward of its outputs.
struct SyncBatchNormFunction : public torch::autograd::Function<SyncBatchNormFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, const at::Tensor& weight,
                            const at::Tensor& bias, at::Tensor running_mean, at::Tensor running_var,
                            double eps, double momentum, int64_t group_address) {
    auto* group = reinterpret_cast<ProcessGroup*>(group_address);
    const auto dims = ReducedDims(input);
    const auto shape = ChannelShape(input);
    const int64_t local_count = input.numel() / input.size(1);

    // Gather (count, mean, M2) per rank and combine them: stable where sum / sum-of-squares
    // would cancel catastrophically.
    at::Tensor local_mean = input.mean(dims);
    at::Tensor local_m2 = (input - local_mean.view(shape)).pow(2).sum(dims);
    at::Tensor mean = local_mean, m2 = local_m2;
    double count = static_cast<double>(local_count);
    if (group != nullptr && group->size() > 1) {
      at::Tensor mine = at::cat({at::full({1}, count, input.options()), local_mean, local_m2});
      std::vector<at::Tensor> all;
      for (int r = 0; r < group->size(); ++r) all.push_back(at::empty_like(mine));
      group->AllGather(all, mine)->Wait();
      const int64_t channels = input.size(1);
      count = 0;
      for (const at::Tensor& theirs : all) {
        const double n = theirs[0].item<double>();
        at::Tensor their_mean = theirs.narrow(0, 1, channels);
        at::Tensor their_m2 = theirs.narrow(0, 1 + channels, channels);
        if (count == 0) {
          mean = their_mean.clone();
          m2 = their_m2.clone();
        } else {
          at::Tensor delta = their_mean - mean;
          const double total = count + n;
          mean = mean + delta * (n / total);
          m2 = m2 + their_m2 + delta.pow(2) * (count * n / total);
        }
        count += n;
      }
    }
    at::Tensor var = m2 / count;
    at::Tensor invstd = (var + eps).rsqrt();
    {
      at::NoGradGuard no_grad;
      running_mean.mul_(1 - momentum).add_(mean, momentum);
      running_var.mul_(1 - momentum).add_(m2 / std::max(count - 1, 1.0), momentum);
    }
    at::Tensor x_hat = (input - mean.view(shape)) * invstd.view(shape);
    ctx->save_for_backward({x_hat, invstd, weight});
    ctx->saved_data["count"] = count;
    ctx->saved_data["group"] = group_address;
    at::Tensor output = x_hat;
    if (weight.defined()) output = output * weight.view(shape) + bias.view(shape);
    return output;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto saved = ctx->get_saved_variables();
    at::Tensor x_hat = saved[0], invstd = saved[1], weight = saved[2];
    const double count = ctx->saved_data["count"].toDouble();
    auto* group = reinterpret_cast<ProcessGroup*>(ctx->saved_data["group"].toInt());
    at::Tensor dy = grad_outputs[0];
    const auto dims = ReducedDims(dy);
    const auto shape = ChannelShape(dy);

    // The parameter gradients stay local sums: DDP averages them like any other gradient.
    at::Tensor local_dy = dy.sum(dims);
    at::Tensor local_dy_xhat = (dy * x_hat).sum(dims);
    const int64_t channels = dy.size(1);
    at::Tensor both = SumAcrossRanks(group, at::cat({local_dy, local_dy_xhat}));
    at::Tensor mean_dy = both.narrow(0, 0, channels) / count;
    at::Tensor mean_dy_xhat = both.narrow(0, channels, channels) / count;
    at::Tensor scale = weight.defined() ? weight * invstd : invstd;
    at::Tensor dx =
        (dy - mean_dy.view(shape) - x_hat * mean_dy_xhat.view(shape)) * scale.view(shape);
    at::Tensor dweight, dbias;
    if (weight.defined()) {
      dweight = local_dy_xhat;
      dbias = local_dy;
    }
    return {dx,           dweight,      dbias,        at::Tensor(),
            at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

SyncBatchNormImpl::SyncBatchNormImpl(SyncBatchNormOptions options,
                                     std::shared_ptr<ProcessGroup> group)
    : options_(options), group_(std::move(group)) {
  reset();
}

void SyncBatchNormImpl::reset() {
  const int64_t n = options_.num_features;
  if (options_.affine) {
    weight = register_parameter("weight", at::ones({n}));
    bias = register_parameter("bias", at::zeros({n}));
  }
  running_mean = register_buffer("running_mean", at::zeros({n}));
  running_var = register_buffer("running_var", at::ones({n}));
  num_batches_tracked = register_buffer("num_batches_tracked", at::zeros({}, at::kLong));
}

at::Tensor SyncBatchNormImpl::forward(const at::Tensor& input) {
  if (input.dim() < 2 || input.size(1) != options_.num_features) {
    throw std::invalid_argument("SyncBatchNorm: expected input [batch, " +
                                std::to_string(options_.num_features) + ", ...], got " +
                                c10::str(input.sizes()));
  }
  if (!is_training()) {
    return at::batch_norm(input, weight, bias, running_mean, running_var, /*training=*/false,
                          options_.momentum, options_.eps, /*cudnn_enabled=*/true);
  }
  {
    at::NoGradGuard no_grad;
    num_batches_tracked.add_(1);
  }
  return SyncBatchNormFunction::apply(input, weight, bias, running_mean, running_var, options_.eps,
                                      options_.momentum, reinterpret_cast<int64_t>(group_.get()));
}

}  // namespace gradhub::ddp
