// The data-parallel GradientPass (gradient_pass.h): the whole model on every rank under one
// DistributedDataParallel, which averages the gradients over all ranks as backward runs.
// Not thread-safe: the training thread drives it.
#pragma once

#include <c10/core/Device.h>

#include <memory>

#include "gpu_worker/data/dataset.h"
#include "gpu_worker/ddp/distributed_data_parallel.h"
#include "gpu_worker/trainer/gradient_pass.h"
#include "gpu_worker/trainer/rank_model.h"
#include "gpu_worker/trainer/training_plan.h"
#include "gpu_worker/trainer/update_rule.h"

namespace gradhub::trainer {

// What a GradientPass works with; every part outlives it.
struct PassContext {
  const TrainingPlan& plan;
  const data::Dataset& dataset;
  c10::Device device;
  const RankModel& model;
  const UpdateRule& rule;  // LossForBackward, GradientSyncOptions
  std::shared_ptr<ddp::ProcessGroup> world;
};

class DataParallelPass : public GradientPass {
 public:
  // Builds the DistributedDataParallel over the model (a collective: rank 0's parameters and
  // buffers go to every rank).
  explicit DataParallelPass(const PassContext& context);

  void ZeroGrad() override { ddp_.ZeroGrad(); }
  at::Tensor Run(data::BatchLoader& loader, bool sync, StepReport& report) override;
  EvalResult Evaluate(const std::vector<int64_t>& validation) override;

 private:
  const PassContext context_;
  ddp::DistributedDataParallel ddp_;
};

}  // namespace gradhub::trainer
