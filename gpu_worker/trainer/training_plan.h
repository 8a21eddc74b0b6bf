// What one rank of a job does, decided before any tensor exists: the spec (with its defaults)
// and the facts of the launch (rank, world size, the node's device and backend, the count of
// training examples) in; the engine's and the loop's settings out. Every rule the trainer
// applies to a spec at start is here, as plain functions of their arguments, each with a test
// of its own (tests/unit/trainer/training_plan_test.cc). The rules that do not depend on the
// launch live in contract/job_spec.h (CheckJobSpec, CheckRankDevice), which CreateJob applies
// first; this file calls them again, from the same code, for a rank started by hand.
//
// No torch here: the engine maps the plan onto its own types (update_rule.h for the optimizer
// and the gradient sync, trainer.cc for the process group and the device).
//
// Thread-compatible: plain functions and values.
#pragma once

#include <cstdint>
#include <optional>

#include "gradhub/v1/jobs.pb.h"
#include "services/common/contract/job_spec.h"

namespace gradhub::trainer {

// What a rank knows about itself when it starts (TrainerOptions, and the dataset once read).
struct LaunchFacts {
  int rank = 0;
  int world_size = 1;
  int local_world_size = 1;  // ranks on this node, which share its cores
  // Intra-op threads asked for (0 = the node's cores divided among its local ranks) and the
  // node's cores (std::thread::hardware_concurrency()).
  int threads = 0;
  int hardware_threads = 1;
  RankDevice device = RankDevice::kCpu;  // the node's (GRADHUB_DEVICE)
  // What the agent resolved the spec's backend AUTO to on this node (GRADHUB_BACKEND); AUTO
  // here = NCCL on kCuda, GLOO on kCpu.
  v1::DistributedSpec::Backend backend = v1::DistributedSpec::AUTO;
  int64_t train_examples = 0;         // the training split's size
  bool telemetry = false;             // a metrics service takes every step's record
  bool fp16_on_cpu_for_test = false;  // TrainerOptions::fp16_scaling_on_cpu_for_test is set
};

// Where the rank trains and how its group reduces.
struct PlacementPlan {
  v1::DistributedSpec::Backend backend = v1::DistributedSpec::GLOO;  // NCCL or GLOO, never AUTO
  bool cuda = false;  // on the node's GPU (NCCL); Gloo reduces CPU tensors, so trains on the CPU
};

// What a step and an epoch hold.
struct BatchPlan {
  int64_t per_rank = 0;      // examples per micro-batch (batchSizePerRank)
  int64_t accumulation = 1;  // micro-batches per optimizer step (gradAccumulationSteps)
  // This rank's shard of an epoch: the training examples divided among the ranks, padded (or
  // cut, with dataset.dropLast) to equal shards, as data::DistributedSampler::per_rank.
  int64_t examples_per_rank = 0;
  int64_t steps_per_epoch = 0;
  // The examples of this rank's shard that each epoch drops only because a pipeline trains
  // whole batches (its micro-batches must be equal) although dataset.dropLast is false: the
  // shard's last, partial batch. 0 without a pipeline, with dropLast (asked for), or when the
  // shard divides into batches. Every replica's shard is the same size, so each drops as many.
  int64_t pipeline_dropped_per_epoch = 0;
  // The examples of this rank's shard that each epoch drops because gradAccumulationSteps does
  // not divide the epoch's micro-batches: those past its last whole optimizer step (with them,
  // without dropLast and a pipeline, the partial batch). Reported on the start line as well.
  int64_t accumulation_dropped_per_epoch = 0;
  int64_t total_steps = 0;  // maxSteps, capped by maxEpochs
  int64_t samples_per_step() const { return per_rank * accumulation; }  // of one rank
};

// Which steps (counted from 1: the step just done) report, evaluate, checkpoint and read the
// loss back. The last step does all four (its evaluation is the final one).
struct Cadence {
  int64_t log_every = 1;
  int64_t eval_every = 0;        // 0 = only at the end
  int64_t checkpoint_every = 0;  // 0 = only at the end
  int64_t total_steps = 0;
  // Every step on the CPU, where reading waits for nothing, and with telemetry, whose record
  // of each step carries its loss.
  bool read_loss_every_step = true;

  bool LogsAt(int64_t step) const { return step % log_every == 0 || step == total_steps; }
  bool EvaluatesAt(int64_t step) const {
    return (eval_every > 0 && step % eval_every == 0) || step == total_steps;
  }
  bool CheckpointsAt(int64_t step) const {
    return (checkpoint_every > 0 && step % checkpoint_every == 0) || step == total_steps;
  }
  // On a GPU the loss is read back (a wait for the GPU) only where it is reported, where the
  // loop waits for the GPU anyway (evaluation, checkpoint) and must not save a model that
  // went NaN unnoticed, and at the last step.
  bool ReadsLossAt(int64_t step) const {
    return read_loss_every_step || LogsAt(step) || EvaluatesAt(step) || CheckpointsAt(step);
  }
};

// How gradients are averaged across ranks (the Reducer's settings, reducer.h).
struct GradientSyncPlan {
  int64_t bucket_cap_bytes = 25 << 20;
  bool find_unused_parameters = false;
  v1::DistributedSpec::CommHook comm_hook = v1::DistributedSpec::NONE;
  v1::DistributedSpec::PowerSgd power_sgd;  // with POWER_SGD, its defaults written in
  uint64_t seed = 0;                        // PowerSGD's random initial Q: the spec's seed
};

struct LocalSgdPlan {
  int64_t period = 1;
  int64_t warmup_steps = 0;
};

// How gradients become the next parameters (update_rule.h).
struct UpdatePlan {
  bool shard_optimizer_state = false;  // ZeRO stage 1
  std::optional<LocalSgdPlan> local_sgd;
  bool loss_scaling = false;  // precision FP16: dynamic loss scaling
  double grad_clip_norm = 0;  // 0 = no clipping
};

enum class Autocast { kNone, kBfloat16, kFloat16 };

// Pipeline model parallelism (JobSpec.parallelism; ddp/pipeline/layout.h): the world is
// `stages` x `replicas` ranks, rank = replica * stages + stage. Every stage of a replica reads
// the same samples (the first stage needs their inputs, the last their targets), so the data
// is sharded by replica, not by rank; without a pipeline (one stage) each rank is a replica.
struct PipelinePlan {
  int stages = 1;    // 1 = no pipeline: data parallelism only
  int replicas = 1;  // world size / stages: the data shards
  int stage = 0;
  int replica = 0;           // this rank's data shard
  int micro_batches = 1;     // a replica's batch is split into these each step
  int chunks_per_stage = 1;  // model pieces per rank; > 1 only interleaved
  v1::ParallelismSpec::Schedule schedule = v1::ParallelismSpec::ONE_F_ONE_B;
  v1::ParallelismSpec::Balance balance = v1::ParallelismSpec::PARAMETERS;

  bool enabled() const { return stages > 1; }
  bool first_stage() const { return stage == 0; }
  bool last_stage() const { return stage == stages - 1; }
  // What this rank's loss counts for when the loss is averaged over all ranks: a replica's
  // loss is known on its stage 0 (the last stage sends it there), which so stands for all
  // `stages` ranks of its replica; the other stages count nothing.
  int loss_weight() const { return first_stage() ? stages : 0; }
};

struct TrainingPlan {
  v1::JobSpec spec;  // with defaults, worldSize as launched (what a checkpoint records)
  int rank = 0;
  int world_size = 1;
  PlacementPlan placement;
  BatchPlan batches;
  Cadence cadence;
  GradientSyncPlan gradient_sync;
  UpdatePlan update;
  // Forward and loss run under autocast to this dtype on the training device: BF16 on either,
  // FP16 on a GPU (on the CPU only in tests, without autocast: the CPU's has no float16).
  Autocast autocast = Autocast::kNone;
  // Ranks hold state the others lack (ZeRO's optimizer shard, local SGD's replica and
  // optimizer, PowerSGD's error feedback): a checkpoint gathers it from every rank, which
  // makes saving a collective.
  bool per_rank_state = false;
  PipelinePlan pipeline;

  bool leader() const { return rank == 0; }
  // Examples of one optimizer step over all ranks: a replica's stages share theirs.
  int64_t global_batch() const { return batches.samples_per_step() * pipeline.replicas; }
  // Saving a checkpoint needs every rank: per-rank state is gathered, and a pipeline's
  // stages each send theirs to rank 0. Rank 0 alone then cannot save on a stop request.
  bool collective_checkpoint() const { return per_rank_state || pipeline.enabled(); }
};

// The spec as this rank runs it, checked in this order (each throws UserError naming the
// field):
//   1. CheckJobSpec: the rules CreateJob applies, an unset worldSize taken as the world size
//      launched.
//   2. distributed.worldSize, when set, is the world size launched (unset: any, as torchrun).
//   3. CheckRankDevice for the backend as placed (PlaceRank) on the node's device: NCCL and
//      FP16 need a CUDA node, and FP16 a GPU the rank trains on.
// Returns it with defaults and the launched world size written in.
v1::JobSpec SpecAsLaunched(const v1::JobSpec& user_spec, const LaunchFacts& launch);

// The spec's backend as this rank uses it: an explicit NCCL or GLOO wins; AUTO becomes the
// agent's choice (LaunchFacts::backend), else NCCL on a CUDA node and GLOO on a CPU node.
PlacementPlan PlaceRank(const v1::JobSpec& spec, const LaunchFacts& launch);

// Steps per epoch and in all. The training examples are sharded over the replicas (PlanPipeline;
// without a pipeline, the ranks). With a pipeline an epoch's last batch is dropped when it is
// not whole, whatever dataset.dropLast says: its micro-batches must be equal (counted in
// BatchPlan::pipeline_dropped_per_epoch, which the trainer's start line reports), and so are
// the micro-batches past an epoch's last whole optimizer step (accumulation_dropped_per_epoch,
// reported too). Throws
// UserError("batchSizePerRank") when a shard holds less than one optimizer step
// (batchSizePerRank x gradAccumulationSteps examples).
BatchPlan PlanBatches(const v1::JobSpec& spec_with_defaults, const LaunchFacts& launch);

// The rank's place in the pipeline, with the spec's defaults applied (microBatches 0 = the
// stages; chunksPerStage 0 = 2 with the interleaved schedule, 1 otherwise). Throws UserError:
//   parallelism.pipelineStages  the stages do not divide the world size launched, or the spec
//                               combines a pipeline with what the trainer does not run with
//                               one (precision FP16, distributed.shardOptimizerState,
//                               localSgd, commHook POWER_SGD: their per-rank state and
//                               agreement across stages are not built);
//   parallelism.schedule        the interleaved schedule on NCCL (its transfers go around the
//                               replica's ring, in an order NCCL's one stream cannot take).
PipelinePlan PlanPipeline(const v1::JobSpec& spec_with_defaults, const LaunchFacts& launch);

// Intra-op threads of the rank: those asked for, else the node's cores divided among its
// local ranks (at least one). Set before the data is read, so before the plan exists.
int IntraOpThreads(const LaunchFacts& launch);

// Everything above, for the spec as the user wrote it.
TrainingPlan PlanTraining(const v1::JobSpec& user_spec, const LaunchFacts& launch);

}  // namespace gradhub::trainer
