#include "gpu_worker/trainer/rank_model.h"

#include <torch/torch.h>

#include <cstdio>
#include <fstream>
#include <ostream>
#include <stdexcept>

#include "gpu_worker/models/measure.h"
#include "gpu_worker/models/stages.h"
#include "services/common/contract/user_error.h"

namespace gradhub::trainer {
namespace {

// Step 2: each layer's cost, the same vector on every rank.
std::vector<double> LayerCosts(const TrainingPlan& plan, const data::Dataset& data,
                               ddp::ProcessGroup& world, const std::function<at::Tensor()>& sample,
                               const std::vector<double>& recorded_costs, const c10::Device& device,
                               std::ostream& log) {
  const v1::ModelSpec& model = plan.spec.model();
  if (plan.pipeline.balance != v1::ParallelismSpec::MEASURED_TIME) {
    return models::LayerParameterCounts(model, data.shape());
  }
  const int64_t layers = models::LayerCount(model, data.shape());
  at::Tensor seconds = torch::zeros({layers}, at::kDouble);
  if (world.rank() == 0 && static_cast<int64_t>(recorded_costs.size()) == layers) {
    log << "gradhub-trainer: rank 0 splits by the layer times its checkpoint recorded\n";
    seconds = torch::tensor(recorded_costs, at::kDouble);
  } else if (world.rank() == 0) {
    const std::vector<double> measured =
        models::MeasureLayerSeconds(model, data.shape(), sample().to(device), plan.spec.seed());
    seconds = torch::tensor(measured, at::kDouble);
  }
  seconds = seconds.to(device);  // an NCCL group moves only tensors on its GPU
  world.Broadcast({seconds}, 0)->Wait();
  seconds = seconds.cpu().contiguous();
  const double* begin = seconds.data_ptr<double>();
  return std::vector<double>(begin, begin + layers);
}

// Step 1: the ranges of every virtual stage.
std::vector<models::StageRange> VirtualStageRanges(const std::vector<double>& costs,
                                                   const PipelinePlan& pipeline) {
  const int64_t virtual_stages = int64_t{pipeline.stages} * pipeline.chunks_per_stage;
  try {
    return models::PartitionLayers(costs, virtual_stages);
  } catch (const std::invalid_argument& error) {
    throw UserError("parallelism.pipelineStages",
                    std::to_string(pipeline.stages) + " stages x " +
                        std::to_string(pipeline.chunks_per_stage) +
                        " chunks need as many layers: " + error.what());
  }
}

int64_t ParameterCount(torch::nn::Module& module) {
  int64_t count = 0;
  for (const at::Tensor& p : module.parameters()) count += p.numel();
  return count;
}

// "830", "8.3 k", "1.2 M".
std::string Amount(int64_t count) {
  char text[32];
  if (count < 1000) return std::to_string(count);
  const bool millions = count >= 1000000;
  std::snprintf(text, sizeof text, "%.1f %s", count / (millions ? 1e6 : 1e3), millions ? "M" : "k");
  return text;
}

// "stage 1/2: layers 0-1 of 3, 8.3 k parameters"; chunks' ranges joined by commas.
std::string StageLine(const PipelinePlan& pipeline, const std::vector<models::StageRange>& ranges,
                      int64_t layers, int64_t parameters) {
  std::string line = "stage " + std::to_string(pipeline.stage + 1) + "/" +
                     std::to_string(pipeline.stages) + ": layers ";
  for (size_t c = 0; c < ranges.size(); ++c) {
    if (c > 0) line += ", ";
    line += std::to_string(ranges[c].first_layer) + "-" + std::to_string(ranges[c].end_layer - 1);
  }
  return line + " of " + std::to_string(layers) + ", " + Amount(parameters) + " parameters";
}

void PlaceForTraining(models::Model& piece, const c10::Device& device) {
  piece.module()->to(device);
  piece.module()->train();
}

// Step 3.
RankModel BuildStage(const TrainingPlan& plan, const data::Dataset& data,
                     const std::vector<models::StageRange>& ranges, const c10::Device& device) {
  const PipelinePlan& pipeline = plan.pipeline;
  RankModel model;
  model.module = std::make_shared<torch::nn::Module>("PipelineStage");
  std::vector<models::StageRange> mine;
  for (int c = 0; c < pipeline.chunks_per_stage; ++c) {
    mine.push_back(ranges[static_cast<size_t>(c * pipeline.stages + pipeline.stage)]);
    model.pieces.push_back(
        models::BuildModelStage(plan.spec.model(), data.shape(), mine.back(), plan.spec.seed()));
    PlaceForTraining(*model.pieces.back(), device);
    model.module->register_module("chunk" + std::to_string(c), model.pieces.back()->module());
  }
  model.description =
      model.pieces.front()->Describe() + "; " +
      StageLine(pipeline, mine, ranges.back().end_layer, ParameterCount(*model.module));
  return model;
}

}  // namespace

RankModel BuildRankModel(const TrainingPlan& plan, const data::Dataset& data,
                         ddp::ProcessGroup& world, const std::function<at::Tensor()>& sample,
                         const std::vector<double>& recorded_costs, const c10::Device& device,
                         std::ostream& log) {
  if (!plan.pipeline.enabled()) {
    RankModel model;
    model.pieces.push_back(models::BuildModel(plan.spec.model(), data.shape()));
    PlaceForTraining(*model.pieces.back(), device);
    model.module = model.pieces.back()->module();
    model.description = model.pieces.back()->Describe();
    return model;
  }
  std::vector<double> costs = LayerCosts(plan, data, world, sample, recorded_costs, device, log);
  RankModel model = BuildStage(plan, data, VirtualStageRanges(costs, plan.pipeline), device);
  model.layer_costs = std::move(costs);
  log << "gradhub-trainer: rank " << plan.rank << " " << model.description << "\n";
  return model;
}

void DumpParameters(const RankModel& model, const std::string& path) {
  std::ofstream out(path);
  if (!out) throw std::runtime_error("cannot write the parameters to " + path);
  char value[32];
  for (const auto& piece : model.pieces) {
    for (const auto& item : piece->module()->named_parameters()) {
      const at::Tensor values = item.value().detach().to(at::kCPU, at::kFloat).contiguous();
      out << item.key() << " " << values.numel();
      const float* data = values.data_ptr<float>();
      for (int64_t i = 0; i < values.numel(); ++i) {
        std::snprintf(value, sizeof value, " %.9g", static_cast<double>(data[i]));
        out << value;
      }
      out << "\n";
    }
  }
  if (!out.flush()) throw std::runtime_error("cannot write the parameters to " + path);
}

}  // namespace gradhub::trainer
