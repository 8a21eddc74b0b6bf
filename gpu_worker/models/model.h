// The model zoo: each architecture is configured by its part of the job spec and checked
// against the dataset's shape before any weights exist, so a mismatch is a user error that
// names both shapes rather than a shape failure deep inside the first forward.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>

#include "gpu_worker/common/data_shape.h"
#include "gradhub/v1/jobs.pb.h"

namespace torch::nn {
class Module;
}

namespace gradhub::models {

class Model {
 public:
  virtual ~Model() = default;
  // A batch of inputs [batch, sample_shape...] to logits [batch, classes], predictions
  // [batch, 1], or next-token logits [batch, context, vocab].
  virtual at::Tensor Forward(const at::Tensor& x) = 0;
  // What DDP wraps, the optimizer updates and checkpoints save.
  virtual std::shared_ptr<torch::nn::Module> module() = 0;
  // One line for logs: architecture, sizes, parameter count.
  virtual std::string Describe() const = 0;
};

// Throws UserError naming the spec field when the spec does not fit the data.
std::unique_ptr<Model> BuildModel(const v1::ModelSpec& spec, const DataShape& data);

}  // namespace gradhub::models
