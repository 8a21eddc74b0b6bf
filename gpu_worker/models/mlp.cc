#include "gpu_worker/models/layered.h"
#include "services/common/contract/user_error.h"

namespace gradhub::models {
namespace {

at::Tensor Activate(const at::Tensor& x, v1::MlpModel::Activation activation) {
  switch (activation) {
    case v1::MlpModel::GELU:
      return torch::gelu(x);
    case v1::MlpModel::TANH:
      return torch::tanh(x);
    case v1::MlpModel::SIGMOID:
      return torch::sigmoid(x);
    default:
      return torch::relu(x);
  }
}

}  // namespace

DenseLayerImpl::DenseLayerImpl(const Options& options)
    : options_(options),
      linear_(register_module("linear", torch::nn::Linear(options.inputs, options.outputs))) {}

at::Tensor DenseLayerImpl::forward(const at::Tensor& input) {
  at::Tensor x = linear_->forward(options_.flatten ? input.flatten(1) : input);
  if (!options_.activation) return x;
  x = Activate(x, *options_.activation);
  return options_.dropout > 0 ? torch::dropout(x, options_.dropout, is_training()) : x;
}

// Layer i is Linear i, with the activation (and dropout) after every Linear but the last.
LayerPlan PlanMlp(const v1::MlpModel& spec, const DataShape& data) {
  std::vector<int64_t> widths(spec.layers().begin(), spec.layers().end());
  if (widths.size() < 2) throw UserError("model.mlp.layers", "needs at least 2 entries");
  int64_t features = 1;
  for (int64_t d : data.sample_shape) features *= d;
  if (widths.front() != features) {
    throw UserError("model.mlp.layers[0]", std::to_string(widths.front()) +
                                               " inputs but the dataset's samples have shape " +
                                               ShapeString(data.sample_shape) + " (" +
                                               std::to_string(features) + " features)");
  }
  const int64_t outputs = ResolveOutputs("model.mlp", data, 0);
  if (widths.back() != outputs) {
    throw UserError("model.mlp.layers[" + std::to_string(widths.size() - 1) + "]",
                    std::to_string(widths.back()) + " outputs but the dataset needs " +
                        std::to_string(outputs) +
                        (data.task == Task::kRegression ? " (regression)" : " (one per class)"));
  }
  std::string sizes;
  for (int64_t w : widths) sizes += (sizes.empty() ? "" : "-") + std::to_string(w);
  const v1::MlpModel::Activation activation = spec.activation();
  const double dropout = spec.dropout();
  LayerPlan plan;
  plan.count = static_cast<int64_t>(widths.size()) - 1;
  plan.build = [widths, activation, dropout, last = plan.count - 1](int64_t i) {
    DenseLayerImpl::Options options{widths[i], widths[i + 1], /*flatten=*/i == 0, {}, dropout};
    if (i != last) options.activation = activation;
    return std::make_shared<DenseLayerImpl>(options);
  };
  plan.description = "mlp " + sizes;
  return plan;
}

}  // namespace gradhub::models
