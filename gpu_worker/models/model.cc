#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <mutex>

#include "gpu_worker/models/layered.h"
#include "services/common/contract/user_error.h"

namespace gradhub::models {
namespace {

std::string WithThousands(int64_t value) {
  std::string digits = std::to_string(value);
  for (int i = static_cast<int>(digits.size()) - 3; i > 0; i -= 3) digits.insert(i, ",");
  return digits;
}

}  // namespace

ModuleModel::ModuleModel(std::shared_ptr<torch::nn::Module> module,
                         std::function<at::Tensor(const at::Tensor&)> forward,
                         std::string description)
    : module_(std::move(module)), forward_(std::move(forward)) {
  int64_t parameters = 0;
  for (const at::Tensor& parameter : module_->parameters()) parameters += parameter.numel();
  description_ = description + " (" + WithThousands(parameters) + " parameters)";
}

ImageShape ResolveImageShape(const std::string& field, const DataShape& data, int64_t spec_channels,
                             int64_t spec_side) {
  const auto& s = data.sample_shape;
  ImageShape image;
  if (s.size() == 3 && s[1] == s[2]) {
    image = {s[0], s[1]};
  } else if (s.size() == 2 && s[0] == s[1]) {
    image = {1, s[0]};
  } else if (s.size() == 1) {
    const int64_t channels = spec_channels > 0 ? spec_channels : 1;
    const int64_t side = std::llround(std::sqrt(static_cast<double>(s[0] / channels)));
    if (side * side * channels == s[0]) image = {channels, side};
  }
  if (spec_channels > 0 && image.channels != 0 && spec_channels != image.channels) image = {};
  if (spec_side > 0 && image.side != 0 && spec_side != image.side) image = {};
  if (image.side == 0) {
    throw UserError(
        field, "needs square images [channels, side, side]" +
                   (spec_channels > 0 || spec_side > 0
                        ? " of [" + std::to_string(spec_channels) + ", " +
                              std::to_string(spec_side) + ", " + std::to_string(spec_side) + "]"
                        : std::string()) +
                   " but the dataset's samples have shape " + ShapeString(s));
  }
  return image;
}

int64_t ResolveOutputs(const std::string& field, const DataShape& data, int64_t spec_classes) {
  switch (data.task) {
    case Task::kRegression:
      return 1;
    case Task::kLanguageModel:
      throw UserError(field, "cannot train on a text dataset; use the transformer model");
    case Task::kClassification:
      break;
  }
  if (spec_classes > 0 && spec_classes < data.num_classes) {
    throw UserError(field + ".numClasses", std::to_string(spec_classes) +
                                               " but the dataset's labels go up to " +
                                               std::to_string(data.num_classes - 1));
  }
  return spec_classes > 0 ? spec_classes : data.num_classes;
}

LayeredModel LayersOf(const v1::ModelSpec& spec, const DataShape& data, uint64_t seed) {
  const auto zoo = [seed](LayerPlan plan) {
    const int64_t count = plan.count;
    return LayeredModel{count, [plan = std::move(plan), seed](StageRange range) {
                          return BuildLayerStage(plan, range, seed);
                        }};
  };
  switch (spec.kind_case()) {
    case v1::ModelSpec::kMlp:
      return zoo(PlanMlp(spec.mlp(), data));
    case v1::ModelSpec::kCnn:
      return zoo(PlanCnn(spec.cnn(), data));
    case v1::ModelSpec::kResnet:
      return zoo(PlanResNet(spec.resnet(), data));
    case v1::ModelSpec::kTransformer:
      return zoo(PlanTransformer(spec.transformer(), data));
    case v1::ModelSpec::kTorchscript:
      return LayersOfTorchScript(spec.torchscript(), data);
    case v1::ModelSpec::KIND_NOT_SET:
      break;
  }
  throw UserError("model", "is not set (mlp, cnn, resnet, transformer or torchscript)");
}

std::unique_ptr<Model> BuildModel(const v1::ModelSpec& spec, const DataShape& data, uint64_t seed) {
  LayeredModel layers = LayersOf(spec, data, seed);
  return layers.build_stage({0, layers.count});
}

std::unique_ptr<Model> BuildModel(const v1::ModelSpec& spec, const DataShape& data) {
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  uint64_t seed = 0;
  {
    std::lock_guard<std::mutex> lock(generator.mutex());
    seed = generator.current_seed();
  }
  return BuildModel(spec, data, seed);
}

int64_t LayerCount(const v1::ModelSpec& spec, const DataShape& data) {
  return LayersOf(spec, data, /*seed=*/0).count;
}

std::unique_ptr<Model> BuildModelStage(const v1::ModelSpec& spec, const DataShape& data,
                                       StageRange range, uint64_t seed) {
  return LayersOf(spec, data, seed).build_stage(range);
}

std::vector<double> LayerParameterCounts(const v1::ModelSpec& spec, const DataShape& data) {
  const LayeredModel layers = LayersOf(spec, data, /*seed=*/0);
  std::vector<double> counts;
  for (int64_t i = 0; i < layers.count; ++i) {
    int64_t parameters = 0;
    for (const at::Tensor& p : layers.build_stage({i, i + 1})->module()->parameters()) {
      parameters += p.numel();
    }
    counts.push_back(static_cast<double>(parameters));
  }
  return counts;
}

}  // namespace gradhub::models
