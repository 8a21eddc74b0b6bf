#include "gpu_worker/models/architectures.h"
#include "services/common/contract/user_error.h"

namespace gradhub::models {
namespace {

class MlpImpl : public torch::nn::Module {
 public:
  MlpImpl(const std::vector<int64_t>& widths, v1::MlpModel::Activation activation, double dropout)
      : activation_(activation), dropout_(dropout) {
    for (size_t i = 0; i + 1 < widths.size(); ++i) {
      layers_.push_back(register_module("linear" + std::to_string(i),
                                        torch::nn::Linear(widths[i], widths[i + 1])));
    }
  }

  at::Tensor forward(at::Tensor x) {
    x = x.flatten(1);
    for (size_t i = 0; i < layers_.size(); ++i) {
      x = layers_[i]->forward(x);
      if (i + 1 == layers_.size()) break;
      x = Activate(x);
      if (dropout_ > 0) x = torch::dropout(x, dropout_, is_training());
    }
    return x;
  }

 private:
  at::Tensor Activate(const at::Tensor& x) const {
    switch (activation_) {
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

  std::vector<torch::nn::Linear> layers_;
  v1::MlpModel::Activation activation_;
  double dropout_;
};

}  // namespace

std::unique_ptr<Model> BuildMlp(const v1::MlpModel& spec, const DataShape& data) {
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
  return MakeModel(std::make_shared<MlpImpl>(widths, spec.activation(), spec.dropout()),
                   "mlp " + sizes);
}

}  // namespace gradhub::models
