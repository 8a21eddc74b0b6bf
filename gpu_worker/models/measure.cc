#include "gpu_worker/models/measure.h"

#include <torch/cuda.h>

#include <algorithm>
#include <chrono>
#include <stdexcept>

#include "gpu_worker/models/layered.h"

namespace gradhub::models {
namespace {

void Synchronize(const c10::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
}

// Step 3 of MeasureLayerSeconds, once.
double ForwardBackwardSeconds(Model& layer, const at::Tensor& input) {
  const at::Tensor x = input.is_floating_point() ? input.detach().requires_grad_() : input;
  Synchronize(x.device());
  const auto start = std::chrono::steady_clock::now();
  const at::Tensor y = layer.Forward(x);
  if (y.requires_grad()) y.sum().backward();
  Synchronize(x.device());
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double MedianSeconds(Model& layer, const at::Tensor& input, int repeats) {
  ForwardBackwardSeconds(layer, input);  // warm-up: allocator, kernels' first launch
  std::vector<double> seconds;
  for (int i = 0; i < repeats; ++i) seconds.push_back(ForwardBackwardSeconds(layer, input));
  std::nth_element(seconds.begin(), seconds.begin() + repeats / 2, seconds.end());
  return seconds[repeats / 2];
}

}  // namespace

std::vector<double> MeasureLayerSeconds(const v1::ModelSpec& spec, const DataShape& data,
                                        const at::Tensor& sample, uint64_t seed, int repeats) {
  if (repeats < 1) {
    throw std::invalid_argument("MeasureLayerSeconds: repeats " + std::to_string(repeats) +
                                " must be at least 1");
  }
  DefaultGeneratorRestorer restorer;
  const LayeredModel layers = LayersOf(spec, data, seed);
  std::vector<double> seconds;
  at::Tensor input = sample;
  for (int64_t i = 0; i < layers.count; ++i) {
    std::unique_ptr<Model> layer = layers.build_stage({i, i + 1});
    layer->module()->to(sample.device());
    layer->module()->train();
    seconds.push_back(MedianSeconds(*layer, input, repeats));
    torch::NoGradGuard no_grad;
    input = layer->Forward(input);
  }
  return seconds;
}

}  // namespace gradhub::models
