// Internal to gpu_worker/models: what the architectures share (layered.h has their builders).
#pragma once

#include <torch/torch.h>

#include <functional>

#include "gpu_worker/models/model.h"

namespace gradhub::models {

// A torch::nn::Module with a forward(x), presented as a Model.
class ModuleModel : public Model {
 public:
  ModuleModel(std::shared_ptr<torch::nn::Module> module,
              std::function<at::Tensor(const at::Tensor&)> forward, std::string description);
  at::Tensor Forward(const at::Tensor& x) override { return forward_(x); }
  std::shared_ptr<torch::nn::Module> module() override { return module_; }
  std::string Describe() const override { return description_; }

 private:
  std::shared_ptr<torch::nn::Module> module_;
  std::function<at::Tensor(const at::Tensor&)> forward_;
  std::string description_;
};

template <typename Impl>
std::unique_ptr<Model> MakeModel(std::shared_ptr<Impl> impl, const std::string& description) {
  Impl* raw = impl.get();
  return std::make_unique<ModuleModel>(
      std::move(impl), [raw](const at::Tensor& x) { return raw->forward(x); }, description);
}

// Images as [channels, side, side]; flat feature vectors of a square count are read as
// single-channel images (the digits CSV is 8x8 pixels in 64 columns).
struct ImageShape {
  int64_t channels = 0;
  int64_t side = 0;
};
ImageShape ResolveImageShape(const std::string& field, const DataShape& data, int64_t spec_channels,
                             int64_t spec_side);

// The output width: the spec's class count, else the data's; 1 for regression.
int64_t ResolveOutputs(const std::string& field, const DataShape& data, int64_t spec_classes);

}  // namespace gradhub::models
