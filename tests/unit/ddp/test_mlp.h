// The plain MLP the engine's tests and the DDP bench train: Linear layers of `widths` with ReLU
// between them. One definition, so a test's reference and the bench train the same model.
#pragma once

#include <torch/torch.h>

#include <string>
#include <vector>

namespace gradhub::testing {

struct Mlp : torch::nn::Module {
  explicit Mlp(const std::vector<int64_t>& widths) {
    for (size_t i = 0; i + 1 < widths.size(); ++i) {
      layers.push_back(
          register_module("fc" + std::to_string(i), torch::nn::Linear(widths[i], widths[i + 1])));
    }
  }
  torch::Tensor forward(torch::Tensor x) {
    for (size_t i = 0; i < layers.size(); ++i) {
      x = layers[i]->forward(x);
      if (i + 1 < layers.size()) x = torch::relu(x);
    }
    return x;
  }
  std::vector<torch::nn::Linear> layers;
};

}  // namespace gradhub::testing
