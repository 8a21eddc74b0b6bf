#include "gpu_worker/models/layered.h"

#include <ATen/CPUGeneratorImpl.h>

#include <mutex>
#include <stdexcept>
#include <utility>
#include <vector>

namespace gradhub::models {
namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// A stage's root module: its layers under "layers", each named by its index in the whole
// model, so that every split names a parameter as the whole model does.
class LayerStageImpl : public torch::nn::Module {
 public:
  LayerStageImpl() : list_(register_module("layers", std::make_shared<torch::nn::Module>())) {}

  void Add(int64_t index, std::shared_ptr<Layer> layer) {
    layers_.push_back(list_->register_module(std::to_string(index), std::move(layer)));
  }

  at::Tensor forward(at::Tensor x) {
    for (const auto& layer : layers_) x = layer->forward(x);
    return x;
  }

 private:
  std::shared_ptr<torch::nn::Module> list_;
  std::vector<std::shared_ptr<Layer>> layers_;
};

void SeedDefaultGenerator(uint64_t seed) {
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_current_seed(seed);
}

}  // namespace

uint64_t LayerSeed(uint64_t seed, int64_t layer) {
  return SplitMix64(SplitMix64(seed) ^ static_cast<uint64_t>(layer));
}

DefaultGeneratorRestorer::DefaultGeneratorRestorer() {
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(generator.mutex());
  saved_ = generator.get_state();
}

DefaultGeneratorRestorer::~DefaultGeneratorRestorer() {
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_state(saved_);
}

void CheckStageRange(StageRange range, int64_t count) {
  if (range.first_layer < 0 || range.first_layer >= range.end_layer || range.end_layer > count) {
    throw std::invalid_argument("stage layers [" + std::to_string(range.first_layer) + ", " +
                                std::to_string(range.end_layer) +
                                ") are not a non-empty range of the model's " +
                                std::to_string(count) + " layers");
  }
}

std::unique_ptr<Model> BuildLayerStage(const LayerPlan& plan, StageRange range, uint64_t seed) {
  CheckStageRange(range, plan.count);
  auto stage = std::make_shared<LayerStageImpl>();
  {
    DefaultGeneratorRestorer restorer;
    for (int64_t i = range.first_layer; i < range.end_layer; ++i) {
      SeedDefaultGenerator(LayerSeed(seed, i));
      stage->Add(i, plan.build(i));
    }
  }
  std::string description = plan.description;
  if (range.size() != plan.count) {
    description += ", layers [" + std::to_string(range.first_layer) + ", " +
                   std::to_string(range.end_layer) + ") of " + std::to_string(plan.count);
  }
  return MakeModel(std::move(stage), description);
}

}  // namespace gradhub::models
