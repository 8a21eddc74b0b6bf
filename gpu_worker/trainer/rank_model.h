// The part of the model one rank trains: the whole model, or with pipeline stages
// (JobSpec.parallelism) only its stage's layers, so that a model too large for one device
// trains split over several.
//
// How a pipeline splits, on every rank alike (BuildRankModel):
//   1. The model's layers (models::LayerCount) are cut into stages x chunks contiguous ranges
//      (models::PartitionLayers), one per virtual stage; chunk c of stage s is virtual stage
//      c x stages + s (one chunk per stage unless the schedule is interleaved).
//   2. The costs it balances: balance PARAMETERS, each layer's parameter count, the same on
//      every rank; MEASURED_TIME, each layer's forward and backward seconds, measured on
//      global rank 0 on the first micro-batch of its training data and broadcast through the
//      world group (a collective), so that every rank partitions the same numbers. A resumed
//      run's rank 0 broadcasts the times its checkpoint recorded instead of measuring again:
//      the same split, so the stages' saved states fit.
//   3. The rank builds its chunks' layers only, each initialized from (seed, layer) as the
//      whole model's are, and logs its split ("stage 1/2: layers 2-3 of 4, 1.2 M
//      parameters").
// Not thread-safe: building seeds torch's default CPU generator.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <functional>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "gpu_worker/data/dataset.h"
#include "gpu_worker/ddp/comm/process_group.h"
#include "gpu_worker/models/model.h"
#include "gpu_worker/trainer/training_plan.h"

namespace torch::nn {
class Module;
}

namespace gradhub::trainer {

struct RankModel {
  // What the rank computes with: the whole model, or its stage's chunks in chunk order.
  std::vector<std::unique_ptr<models::Model>> pieces;
  // What the optimizer updates and checkpoints save: the whole model's module, or a module
  // holding the chunks' ("chunk0", "chunk1", ...).
  std::shared_ptr<torch::nn::Module> module;
  std::string description;          // for the start line: the model, and the stage's layers
  std::vector<double> layer_costs;  // a pipeline's: what its split balanced (step 2)
};

// The rank's model on `device`, in training mode (steps above). `world`: every rank of the
// job; `sample`: the inputs of this rank's first training micro-batch, called on global rank 0
// with balance MEASURED_TIME only, unless `recorded_costs` (rank 0's, from the checkpoint it
// resumes from: RecordedLayerCosts) has a time per layer. Throws
// UserError("parallelism.pipelineStages") when the model has fewer layers than its stages x chunks
// (known here for a TorchScript model, whose layers are its file's).
RankModel BuildRankModel(const TrainingPlan& plan, const data::Dataset& data,
                         ddp::ProcessGroup& world, const std::function<at::Tensor()>& sample,
                         const std::vector<double>& recorded_costs, const c10::Device& device,
                         std::ostream& log);

// Writes the pieces' parameters as text to `path`: one line each, its name (the whole model's
// name for it, "layers.3.fc.weight", whatever the split), its element count, then its values
// as float32 to 9 significant digits. For tests comparing runs of different splits.
void DumpParameters(const RankModel& model, const std::string& path);

}  // namespace gradhub::trainer
