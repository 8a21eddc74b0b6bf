#include "gpu_worker/trainer/training_plan.h"

#include <algorithm>
#include <string>

#include "services/common/contract/user_error.h"

namespace gradhub::trainer {
namespace {

using Distributed = v1::DistributedSpec;

Cadence CadenceOf(const v1::JobSpec& spec, const PlacementPlan& placement, const BatchPlan& batches,
                  const LaunchFacts& launch) {
  Cadence cadence;
  cadence.log_every = spec.log_every_steps();
  cadence.eval_every = spec.eval_every_steps();
  cadence.checkpoint_every = spec.checkpoint().every_steps();
  cadence.total_steps = batches.total_steps;
  cadence.read_loss_every_step = !placement.cuda || launch.telemetry;
  return cadence;
}

GradientSyncPlan GradientSyncOf(const v1::JobSpec& spec) {
  const Distributed& distributed = spec.distributed();
  GradientSyncPlan sync;
  sync.bucket_cap_bytes = static_cast<int64_t>(distributed.bucket_cap_mb() * (1 << 20));
  sync.find_unused_parameters = distributed.find_unused_parameters();
  sync.comm_hook = distributed.comm_hook();
  sync.power_sgd = distributed.power_sgd();
  sync.seed = spec.seed();
  return sync;
}

UpdatePlan UpdateOf(const v1::JobSpec& spec) {
  const Distributed& distributed = spec.distributed();
  UpdatePlan update;
  update.shard_optimizer_state = distributed.shard_optimizer_state();
  if (distributed.has_local_sgd()) {
    update.local_sgd =
        LocalSgdPlan{distributed.local_sgd().period(), distributed.local_sgd().warmup_steps()};
  }
  update.loss_scaling = spec.precision() == v1::JobSpec::FP16;
  update.grad_clip_norm = spec.grad_clip_norm();
  return update;
}

int PipelineStagesOf(const v1::JobSpec& spec) {
  return std::max(1, spec.parallelism().pipeline_stages());
}

// What the trainer does not run with a pipeline, as the spec's rules refuse it first
// (CheckJobSpec); here again for a rank started by hand.
void RefuseWhatPipelinesLack(const v1::JobSpec& spec) {
  const Distributed& distributed = spec.distributed();
  const char* lacking = nullptr;
  if (spec.precision() == v1::JobSpec::FP16) lacking = "precision FP16";
  if (distributed.shard_optimizer_state()) lacking = "distributed.shardOptimizerState";
  if (distributed.has_local_sgd()) lacking = "distributed.localSgd";
  if (distributed.comm_hook() == Distributed::POWER_SGD) lacking = "distributed.commHook POWER_SGD";
  if (lacking == nullptr) return;
  throw UserError("parallelism.pipelineStages",
                  std::string("a pipeline cannot be combined with ") + lacking +
                      " (its state per rank and the stages' agreement on it are not built)");
}

Autocast AutocastOf(const v1::JobSpec& spec, const PlacementPlan& placement) {
  if (spec.precision() == v1::JobSpec::BF16) return Autocast::kBfloat16;
  if (spec.precision() == v1::JobSpec::FP16 && placement.cuda) return Autocast::kFloat16;
  return Autocast::kNone;
}

}  // namespace

int IntraOpThreads(const LaunchFacts& launch) {
  if (launch.threads > 0) return launch.threads;
  return std::max(1, launch.hardware_threads / std::max(1, launch.local_world_size));
}

PlacementPlan PlaceRank(const v1::JobSpec& spec, const LaunchFacts& launch) {
  const bool gpu_node = launch.device == RankDevice::kCuda;
  Distributed::Backend backend = spec.distributed().backend();
  if (backend == Distributed::AUTO) backend = launch.backend;
  if (backend == Distributed::AUTO) backend = gpu_node ? Distributed::NCCL : Distributed::GLOO;
  PlacementPlan placement;
  placement.backend = backend;
  placement.cuda = backend == Distributed::NCCL && gpu_node;
  return placement;
}

v1::JobSpec SpecAsLaunched(const v1::JobSpec& user_spec, const LaunchFacts& launch) {
  // An unset worldSize means the ranks launched (as torchrun's), and the rules that depend on
  // the world (pipeline stages dividing it, a synthetic dataset's share) see that one.
  v1::JobSpec checked = user_spec;
  if (checked.distributed().world_size() == 0) {
    checked.mutable_distributed()->set_world_size(launch.world_size);
  }
  CheckJobSpec(checked);
  const int32_t asked = user_spec.distributed().world_size();
  if (asked != 0 && asked != launch.world_size) {
    throw UserError("distributed.worldSize", std::to_string(asked) + " but the trainer runs " +
                                                 std::to_string(launch.world_size) + " ranks");
  }
  v1::JobSpec spec = WithDefaults(user_spec);
  spec.mutable_distributed()->set_world_size(launch.world_size);
  // Submission cannot know where the ranks land; the rank does. The backend as placed, not
  // AUTO: AUTO became GLOO on a CPU node, or where the agent said so.
  v1::JobSpec as_placed = spec;
  as_placed.mutable_distributed()->set_backend(PlaceRank(spec, launch).backend);
  RankDeviceRules rules;
  rules.allow_fp16_on_cpu = launch.fp16_on_cpu_for_test;
  CheckRankDevice(as_placed, launch.device, rules);
  return spec;
}

BatchPlan PlanBatches(const v1::JobSpec& spec, const LaunchFacts& launch) {
  BatchPlan batches;
  batches.per_rank = spec.batch_size_per_rank();
  batches.accumulation = spec.grad_accumulation_steps();
  const bool drop_last = spec.dataset().drop_last();
  const int stages = PipelineStagesOf(spec);
  const int64_t examples = launch.train_examples, shards = std::max(1, launch.world_size / stages);
  batches.examples_per_rank = drop_last ? examples / shards : (examples + shards - 1) / shards;
  const int64_t per_rank = batches.examples_per_rank, batch = batches.per_rank;
  const bool whole_batches = drop_last || stages > 1;
  const int64_t micro_per_epoch = whole_batches ? per_rank / batch : (per_rank + batch - 1) / batch;
  batches.steps_per_epoch = micro_per_epoch / batches.accumulation;
  if (whole_batches && !drop_last) batches.pipeline_dropped_per_epoch = per_rank % batch;
  const int64_t trainable = whole_batches ? per_rank - per_rank % batch : per_rank;
  batches.accumulation_dropped_per_epoch =
      trainable - std::min(trainable, batches.steps_per_epoch * batches.accumulation * batch);
  if (batches.steps_per_epoch == 0) {
    throw UserError("batchSizePerRank",
                    std::to_string(batch) + " x " + std::to_string(batches.accumulation) +
                        " micro-batches exceed the " + std::to_string(per_rank) +
                        " training examples of each rank");
  }
  batches.total_steps = spec.max_steps();
  if (spec.max_epochs() > 0) {
    const int64_t by_epochs = spec.max_epochs() * batches.steps_per_epoch;
    batches.total_steps =
        batches.total_steps > 0 ? std::min(batches.total_steps, by_epochs) : by_epochs;
  }
  return batches;
}

PipelinePlan PlanPipeline(const v1::JobSpec& spec, const LaunchFacts& launch) {
  const v1::ParallelismSpec& parallelism = spec.parallelism();
  PipelinePlan pipeline;
  pipeline.stages = PipelineStagesOf(spec);
  if (launch.world_size % pipeline.stages != 0) {
    throw UserError("parallelism.pipelineStages",
                    std::to_string(pipeline.stages) + " stages do not divide the " +
                        std::to_string(launch.world_size) + " ranks launched");
  }
  pipeline.replicas = launch.world_size / pipeline.stages;
  pipeline.stage = launch.rank % pipeline.stages;
  pipeline.replica = launch.rank / pipeline.stages;
  if (!pipeline.enabled()) return pipeline;
  RefuseWhatPipelinesLack(spec);
  pipeline.schedule = parallelism.schedule();
  pipeline.balance = parallelism.balance();
  pipeline.micro_batches =
      parallelism.micro_batches() > 0 ? parallelism.micro_batches() : pipeline.stages;
  if (pipeline.schedule == v1::ParallelismSpec::INTERLEAVED_ONE_F_ONE_B) {
    pipeline.chunks_per_stage =
        parallelism.chunks_per_stage() > 0 ? parallelism.chunks_per_stage() : 2;
    if (PlaceRank(spec, launch).backend == Distributed::NCCL) {
      throw UserError("parallelism.schedule",
                      "INTERLEAVED_ONE_F_ONE_B runs on Gloo only (its transfers go around the "
                      "replica's ring, in an order NCCL's one stream cannot take); this rank's "
                      "backend is NCCL: use ONE_F_ONE_B or GPIPE, or backend GLOO");
    }
  }
  return pipeline;
}

TrainingPlan PlanTraining(const v1::JobSpec& user_spec, const LaunchFacts& launch) {
  TrainingPlan plan;
  plan.spec = SpecAsLaunched(user_spec, launch);
  const v1::JobSpec& spec = plan.spec;
  plan.rank = launch.rank;
  plan.world_size = launch.world_size;
  plan.placement = PlaceRank(spec, launch);
  plan.pipeline = PlanPipeline(spec, launch);
  plan.batches = PlanBatches(spec, launch);
  plan.cadence = CadenceOf(spec, plan.placement, plan.batches, launch);
  plan.gradient_sync = GradientSyncOf(spec);
  plan.update = UpdateOf(spec);
  plan.autocast = AutocastOf(spec, plan.placement);
  plan.per_rank_state = plan.update.shard_optimizer_state || plan.update.local_sgd.has_value() ||
                        plan.gradient_sync.comm_hook == Distributed::POWER_SGD;
  return plan;
}

}  // namespace gradhub::trainer
