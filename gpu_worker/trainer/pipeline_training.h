// The pipelined GradientPass (gradient_pass.h): this rank holds one stage of the model
// (rank_model.h), and a step runs ddp::pipeline::PipelineStage over the world group, which
// sends activations forward and gradients backward between neighbouring stages and averages
// each stage's gradients over its replicas (JobSpec.parallelism; layout:
// rank = replica x stages + stage).
//
// Set up, on every rank in the same order (the constructor):
//   1. The data-parallel group of each stage, ranks {replica x stages + stage}: every rank
//      creates every stage's subgroup, in stage order, and keeps its own stage's.
//   2. With more than one replica, a DistributedDataParallel over each of the rank's chunks
//      on its stage's group (a collective of that group: replica 0's parameters go to the
//      others), so each chunk's gradients are averaged once per step, overlapping its last
//      backward.
//   3. The PipelineStage over the world group, with the plan's schedule and micro-batches.
// A step (Run): for each of the gradAccumulationSteps batches, one PipelineStage::Step with
// the batch's inputs on the first stage and its targets on the last; gradient sync armed on
// the last batch only. Every stage of a replica reads the same batches (the data is sharded by
// replica); the stages between the first and the last read them too and pass them on to no
// one: the copy of a batch's rows costs little beside a stage's forward, and keeps one loader
// logic (resume position, epochs) for every rank.
// Evaluation (pipeline_evaluation.h): forward only, through the stages.
// Not thread-safe: the training thread drives it.
#pragma once

#include <memory>
#include <vector>

#include "gpu_worker/ddp/comm/process_group.h"
#include "gpu_worker/ddp/distributed_data_parallel.h"
#include "gpu_worker/ddp/pipeline/layout.h"
#include "gpu_worker/ddp/pipeline/pipeline_stage.h"
#include "gpu_worker/trainer/data_parallel_pass.h"

namespace gradhub::trainer {

class PipelinePass : public GradientPass {
 public:
  // `world_options`: how the world group was made; its subgroups are made alike.
  PipelinePass(const PassContext& context, const ddp::ProcessGroupOptions& world_options);
  ~PipelinePass() override;

  void ZeroGrad() override;
  at::Tensor Run(data::BatchLoader& loader, bool sync, StepReport& report) override;
  EvalResult Evaluate(const std::vector<int64_t>& validation) override;

 private:
  // Sums over the step's PipelineStage::Step calls.
  struct StepSums {
    double step_seconds = 0, forward_seconds = 0, backward_seconds = 0;
  };
  void AddStageReport(const ddp::pipeline::StageStepReport& stage, StepSums& sums,
                      StepReport& report) const;
  void AddReduction(bool sync, StepReport& report) const;

  const PassContext context_;
  const ddp::pipeline::PipelineLayout layout_;
  std::shared_ptr<ddp::ProcessGroup> stage_group_;  // this stage's replicas; null with one
  std::vector<std::unique_ptr<ddp::DistributedDataParallel>> chunk_ddps_;  // with replicas
  std::unique_ptr<ddp::pipeline::PipelineStage> stage_;
};

}  // namespace gradhub::trainer
