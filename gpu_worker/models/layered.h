// Internal to gpu_worker/models: every model as an ordered list of layers, so that a pipeline
// stage builds only its own layers (stages.h says which layers each architecture has).
//
// Initialization does not depend on the split: layer i is built with torch's default CPU
// generator seeded from (the model seed, i) (LayerSeed), so layer i is the same tensor for
// tensor whether it is built alone, in any stage, or in the whole model. The whole model is
// the one-stage split: BuildModel and BuildModelStage go through BuildLayerStage alike.
//
// Not thread-safe against other users of torch's default CPU generator: building a layer
// seeds it, and the generator's state is restored once the stage is built.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "gpu_worker/models/architectures.h"
#include "gpu_worker/models/stages.h"

namespace gradhub::models {

// One layer: a module applied to the previous layer's output (the first to the batch).
class Layer : public torch::nn::Module {
 public:
  virtual at::Tensor forward(const at::Tensor& x) = 0;
};

// A Linear layer; it flattens its input first if asked, and applies an activation, then
// dropout, after it if asked: the MLP's layers and the CNN's fully connected ones.
class DenseLayerImpl : public Layer {
 public:
  struct Options {
    int64_t inputs = 0;
    int64_t outputs = 0;
    bool flatten = false;
    std::optional<v1::MlpModel::Activation> activation;  // none: no dropout either
    double dropout = 0;
  };
  explicit DenseLayerImpl(const Options& options);
  at::Tensor forward(const at::Tensor& x) override;

 private:
  Options options_;
  torch::nn::Linear linear_;
};

// A zoo architecture, checked against the data, before any weights exist.
struct LayerPlan {
  int64_t count = 0;
  // Builds layer i, 0 <= i < count, drawing from torch's default CPU generator.
  std::function<std::shared_ptr<Layer>(int64_t)> build;
  std::string description;  // e.g. "mlp 64-32-10"
};

LayerPlan PlanMlp(const v1::MlpModel& spec, const DataShape& data);
LayerPlan PlanCnn(const v1::CnnModel& spec, const DataShape& data);
LayerPlan PlanResNet(const v1::ResNetModel& spec, const DataShape& data);
LayerPlan PlanTransformer(const v1::TransformerModel& spec, const DataShape& data);

// The generator seed of layer `layer` of a model seeded with `seed` (splitmix64 of both).
uint64_t LayerSeed(uint64_t seed, int64_t layer);

// The stage's layers, each built under LayerSeed(seed, i), as one module whose parameters are
// named "layers.<i>.<the layer's own name>" (i the layer's index in the whole model), and
// whose Forward applies them in order. Throws std::invalid_argument for a range that is empty
// or outside [0, plan.count).
std::unique_ptr<Model> BuildLayerStage(const LayerPlan& plan, StageRange range, uint64_t seed);

// The layers a model has and a way to build any range of them; for the zoo a LayerPlan, for a
// TorchScript model its loaded module's top-level children.
struct LayeredModel {
  int64_t count = 0;
  std::function<std::unique_ptr<Model>(StageRange)> build_stage;
};
LayeredModel LayersOf(const v1::ModelSpec& spec, const DataShape& data, uint64_t seed);
// Loads the file and checks its outputs on the data; its stages are its top-level children.
LayeredModel LayersOfTorchScript(const v1::TorchScriptModel& spec, const DataShape& data);

// Throws std::invalid_argument unless 0 <= first < end <= count.
void CheckStageRange(StageRange range, int64_t count);

// Saves torch's default CPU generator's state and restores it when destroyed.
class DefaultGeneratorRestorer {
 public:
  DefaultGeneratorRestorer();
  ~DefaultGeneratorRestorer();
  DefaultGeneratorRestorer(const DefaultGeneratorRestorer&) = delete;
  DefaultGeneratorRestorer& operator=(const DefaultGeneratorRestorer&) = delete;

 private:
  at::Tensor saved_;
};

}  // namespace gradhub::models
