// The model zoo: each architecture is configured by its part of the job spec and checked
// against the dataset's shape before any weights exist, so a mismatch is a user error that
// names both shapes rather than a shape failure deep inside the first forward.
//
// Every model is an ordered list of layers (stages.h lists them), and a pipeline stage builds
// only its own range of them, so a model too large for one device trains split across several.
// Layer i's initial weights depend only on (seed, i): the stages of any split start from the
// same weights as the whole model, which is itself the one-stage split.
//
// Thread-safety: building seeds torch's default CPU generator while it runs (and restores its
// state after), so do not build while another thread draws from that generator. A built Model
// is as thread-compatible as its torch module.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gpu_worker/common/data_shape.h"
#include "gpu_worker/models/stages.h"
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

// Every function below throws UserError naming the spec field when the spec does not fit the
// data (or a TorchScript file cannot be read or split).

// The whole model, its weights initialized from `seed` (the trainer's JobSpec.seed); equal,
// name for name and bit for bit, to BuildModelStage over all its layers. A TorchScript model
// keeps its file's weights and runs its own forward.
std::unique_ptr<Model> BuildModel(const v1::ModelSpec& spec, const DataShape& data, uint64_t seed);
// As above, seeded with torch's current seed (what at::manual_seed last set, as the trainer
// sets it to JobSpec.seed), so it equals BuildModel(spec, data, that seed).
std::unique_ptr<Model> BuildModel(const v1::ModelSpec& spec, const DataShape& data);

// How many layers the model has: for the zoo ZooLayerCount; for TorchScript the loaded
// module's top-level children (at least 1), which loads the file.
int64_t LayerCount(const v1::ModelSpec& spec, const DataShape& data);

// A pipeline stage: only the layers [range.first_layer, range.end_layer) are built. Its module
// names parameters as the whole model does ("layers.3.fc1.weight"; TorchScript: the file's
// names with dots as underscores), so any split's parameters together are the whole model's.
// Its Forward takes what the previous stage's returns (the first stage: the batch) and
// applies its layers in order. A TorchScript stage runs its top-level children in sequence;
// splitting one is refused (naming model.torchscript and parallelism.pipelineStages) unless
// running all its children in order on a sample batch gives its own forward's output.
// A range over all layers is BuildModel's model. Throws std::invalid_argument for a range
// that is empty or outside [0, LayerCount).
std::unique_ptr<Model> BuildModelStage(const v1::ModelSpec& spec, const DataShape& data,
                                       StageRange range, uint64_t seed);

// The parameter count of each layer, for PartitionLayers; each layer is built alone and
// dropped, so peak memory is one layer's. The same on every rank.
std::vector<double> LayerParameterCounts(const v1::ModelSpec& spec, const DataShape& data);

}  // namespace gradhub::models
