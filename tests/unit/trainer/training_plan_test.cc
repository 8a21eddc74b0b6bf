// training_plan.h: one test per rule, without torch (the plan is computed before any tensor).
#include "gpu_worker/trainer/training_plan.h"

#include <gtest/gtest.h>

#include <string>

#include "services/common/contract/job_spec.h"
#include "services/common/contract/user_error.h"

namespace gradhub::trainer {
namespace {

using Distributed = v1::DistributedSpec;

// 1000 training examples, batches of 10: 100 micro-batches per epoch at world size 1. `extra`
// is merged in (its fields replace these).
v1::JobSpec Spec(const std::string& extra = "") {
  v1::JobSpec spec = ParseJobSpec(
      "model: {mlp: {layers: [4, 8, 2]}}\n"
      "dataset: {synthetic: {numSamples: 1000, numFeatures: 4, numClasses: 2}}\n"
      "optimizer: {sgd: {lr: 0.1}}\n"
      "batchSizePerRank: 10\n"
      "maxSteps: 50\n");
  if (!extra.empty()) spec.MergeFrom(ParseJobSpec(extra));
  return spec;
}

LaunchFacts Launch(int world_size = 1, RankDevice device = RankDevice::kCpu) {
  LaunchFacts launch;
  launch.world_size = world_size;
  launch.local_world_size = world_size;
  launch.device = device;
  launch.hardware_threads = 8;
  launch.train_examples = 1000;
  return launch;
}

// The field of the UserError PlanTraining throws, with its message; "(planned)" if none.
std::string Refusal(const v1::JobSpec& spec, const LaunchFacts& launch) {
  try {
    PlanTraining(spec, launch);
  } catch (const UserError& error) {
    return error.field() + " | " + error.what();
  }
  return "(planned)";
}

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// --- the spec ---

TEST(TrainingPlanTest, RefusesWhatCreateJobRefuses) {
  const std::string refusal =
      Refusal(Spec("precision: FP16\ndistributed: {localSgd: {period: 2}}\n"),
              Launch(1, RankDevice::kCuda));
  EXPECT_TRUE(Contains(refusal, "distributed.localSgd")) << refusal;
  const std::string invalid = Refusal(Spec("optimizer: {sgd: {lr: -1}}\n"), Launch());
  EXPECT_TRUE(Contains(invalid, "optimizer.sgd.lr")) << invalid;
}

TEST(TrainingPlanTest, WorldSizeIsTheLaunchedOneUnlessTheSpecSaysAnother) {
  EXPECT_EQ(PlanTraining(Spec(), Launch(3)).spec.distributed().world_size(), 3);
  EXPECT_EQ(PlanTraining(Spec("distributed: {worldSize: 2}\n"), Launch(2)).world_size, 2);
  const std::string refusal = Refusal(Spec("distributed: {worldSize: 2}\n"), Launch(3));
  EXPECT_TRUE(Contains(refusal, "distributed.worldSize | ")) << refusal;
  EXPECT_TRUE(Contains(refusal, "2 but the trainer runs 3 ranks")) << refusal;
}

TEST(TrainingPlanTest, DefaultsAreWrittenIn) {
  const TrainingPlan plan = PlanTraining(Spec(), Launch());
  EXPECT_EQ(plan.spec.log_every_steps(), 10);
  EXPECT_EQ(plan.batches.accumulation, 1);
  EXPECT_EQ(plan.gradient_sync.bucket_cap_bytes, 25 << 20);
}

// --- placement ---

TEST(TrainingPlanTest, AutoBecomesNcclOnACudaNodeAndGlooOnACpuNode) {
  const PlacementPlan gpu = PlaceRank(Spec(), Launch(1, RankDevice::kCuda));
  EXPECT_EQ(gpu.backend, Distributed::NCCL);
  EXPECT_TRUE(gpu.cuda);
  const PlacementPlan cpu = PlaceRank(Spec(), Launch(1, RankDevice::kCpu));
  EXPECT_EQ(cpu.backend, Distributed::GLOO);
  EXPECT_FALSE(cpu.cuda);
}

TEST(TrainingPlanTest, AutoBecomesTheAgentsBackendAndAnExplicitOneWins) {
  LaunchFacts launch = Launch(1, RankDevice::kCuda);
  launch.backend = Distributed::GLOO;
  EXPECT_EQ(PlaceRank(Spec(), launch).backend, Distributed::GLOO);
  EXPECT_FALSE(PlaceRank(Spec(), launch).cuda);  // Gloo reduces CPU tensors: trains on the CPU
  const PlacementPlan nccl = PlaceRank(Spec("distributed: {backend: NCCL}\n"), launch);
  EXPECT_EQ(nccl.backend, Distributed::NCCL);
  EXPECT_TRUE(nccl.cuda);
}

TEST(TrainingPlanTest, NcclOnACpuNodeIsRefusedNamingTheBackend) {
  const std::string refusal = Refusal(Spec("distributed: {backend: NCCL}\n"), Launch());
  EXPECT_TRUE(Contains(refusal, "distributed.backend | ")) << refusal;
  EXPECT_TRUE(Contains(refusal, "NCCL needs a GPU node")) << refusal;
  LaunchFacts told_nccl = Launch();  // AUTO, resolved to NCCL by the agent
  told_nccl.backend = Distributed::NCCL;
  EXPECT_TRUE(Contains(Refusal(Spec(), told_nccl), "distributed.backend | "));
}

TEST(TrainingPlanTest, Fp16IsRefusedWhereTheRankTrainsOnTheCpu) {
  const v1::JobSpec fp16 = Spec("precision: FP16\n");
  EXPECT_TRUE(Contains(Refusal(fp16, Launch()), "precision | "));
  LaunchFacts gloo_on_gpu = Launch(1, RankDevice::kCuda);
  gloo_on_gpu.backend = Distributed::GLOO;
  EXPECT_TRUE(Contains(Refusal(fp16, gloo_on_gpu), "precision | "));
  LaunchFacts test_only = Launch();
  test_only.fp16_on_cpu_for_test = true;
  const TrainingPlan plan = PlanTraining(fp16, test_only);
  EXPECT_TRUE(plan.update.loss_scaling);
  EXPECT_EQ(plan.autocast, Autocast::kNone);  // the CPU's autocast has no float16
}

TEST(TrainingPlanTest, PrecisionChoosesAutocastAndLossScaling) {
  const TrainingPlan fp16 = PlanTraining(Spec("precision: FP16\n"), Launch(1, RankDevice::kCuda));
  EXPECT_EQ(fp16.autocast, Autocast::kFloat16);
  EXPECT_TRUE(fp16.update.loss_scaling);
  const TrainingPlan bf16 = PlanTraining(Spec("precision: BF16\n"), Launch());
  EXPECT_EQ(bf16.autocast, Autocast::kBfloat16);
  EXPECT_FALSE(bf16.update.loss_scaling);
  EXPECT_EQ(PlanTraining(Spec(), Launch()).autocast, Autocast::kNone);
}

// --- batches ---

TEST(TrainingPlanTest, StepsPerEpochDivideTheRanksShardIntoOptimizerSteps) {
  // 1000 examples over 3 ranks: 334 each (padded), 34 micro-batches of 10, 17 steps of 2.
  const TrainingPlan padded = PlanTraining(Spec("gradAccumulationSteps: 2\n"), Launch(3));
  EXPECT_EQ(padded.batches.examples_per_rank, 334);
  EXPECT_EQ(padded.batches.steps_per_epoch, 17);
  EXPECT_EQ(padded.global_batch(), 60);
  // dropLast: 333 each, 33 whole micro-batches, 16 steps.
  const TrainingPlan cut =
      PlanTraining(Spec("gradAccumulationSteps: 2\ndataset: {dropLast: true}\n"), Launch(3));
  EXPECT_EQ(cut.batches.examples_per_rank, 333);
  EXPECT_EQ(cut.batches.steps_per_epoch, 16);
}

TEST(TrainingPlanTest, MaxEpochsCapsMaxSteps) {
  EXPECT_EQ(PlanTraining(Spec("maxEpochs: 1\n"), Launch()).batches.total_steps, 50);
  EXPECT_EQ(PlanTraining(Spec("maxSteps: 500\nmaxEpochs: 2\n"), Launch()).batches.total_steps, 200);
  v1::JobSpec epochs_only = Spec("maxEpochs: 3\n");
  epochs_only.clear_max_steps();
  EXPECT_EQ(PlanTraining(epochs_only, Launch()).batches.total_steps, 300);
}

TEST(TrainingPlanTest, AStepLargerThanARanksExamplesIsRefusedNamingBatchSizePerRank) {
  LaunchFacts launch = Launch(4);
  launch.train_examples = 38;  // 10 per rank (padded): one micro-batch of 10
  const std::string refusal = Refusal(Spec("gradAccumulationSteps: 2\n"), launch);
  EXPECT_TRUE(Contains(refusal, "batchSizePerRank | ")) << refusal;
  EXPECT_TRUE(Contains(refusal, "10 x 2 micro-batches exceed the 10 training examples")) << refusal;
  EXPECT_EQ(Refusal(Spec(), launch), "(planned)");  // one step of one micro-batch
}

// --- cadence ---

TEST(TrainingPlanTest, TheLossIsReadEveryStepOnTheCpu) {
  const Cadence cadence = PlanTraining(Spec(), Launch()).cadence;
  for (int64_t step = 1; step <= 50; ++step) EXPECT_TRUE(cadence.ReadsLossAt(step)) << step;
}

TEST(TrainingPlanTest, OnAGpuTheLossIsReadOnlyWhereItIsUsed) {
  const v1::JobSpec spec =
      Spec("maxSteps: 23\nlogEverySteps: 5\nevalEverySteps: 7\ncheckpoint: {everySteps: 4}\n");
  const Cadence cadence = PlanTraining(spec, Launch(1, RankDevice::kCuda)).cadence;
  std::string read;
  for (int64_t step = 1; step <= 23; ++step) {
    if (cadence.ReadsLossAt(step)) read += std::to_string(step) + " ";
  }
  EXPECT_EQ(read, "4 5 7 8 10 12 14 15 16 20 21 23 ");
  LaunchFacts with_telemetry = Launch(1, RankDevice::kCuda);
  with_telemetry.telemetry = true;  // every step's record carries its loss
  EXPECT_TRUE(PlanTraining(spec, with_telemetry).cadence.ReadsLossAt(1));
}

TEST(TrainingPlanTest, TheLastStepLogsEvaluatesAndCheckpoints) {
  const Cadence cadence = PlanTraining(Spec("maxSteps: 23\n"), Launch()).cadence;
  EXPECT_TRUE(cadence.LogsAt(23));
  EXPECT_TRUE(cadence.EvaluatesAt(23));
  EXPECT_TRUE(cadence.CheckpointsAt(23));
  EXPECT_TRUE(cadence.LogsAt(20));
  EXPECT_FALSE(cadence.LogsAt(21));
  EXPECT_FALSE(cadence.EvaluatesAt(20));  // evalEverySteps 0: at the end only
  EXPECT_FALSE(cadence.CheckpointsAt(20));
}

// --- engine settings ---

TEST(TrainingPlanTest, ThreadsAreAskedOrTheNodesCoresSharedByItsRanks) {
  LaunchFacts launch = Launch(3);
  EXPECT_EQ(IntraOpThreads(launch), 2);  // 8 cores, 3 ranks
  launch.threads = 5;
  EXPECT_EQ(IntraOpThreads(launch), 5);
  launch.threads = 0;
  launch.hardware_threads = 2;
  EXPECT_EQ(IntraOpThreads(launch), 1);  // never 0
}

TEST(TrainingPlanTest, RanksHoldStateOfTheirOwnWithZeroLocalSgdOrPowerSgd) {
  EXPECT_FALSE(PlanTraining(Spec(), Launch(2)).per_rank_state);
  EXPECT_FALSE(PlanTraining(Spec("distributed: {commHook: FP16}\n"), Launch(2)).per_rank_state);
  for (const char* mode :
       {"distributed: {shardOptimizerState: true}\n", "distributed: {localSgd: {period: 4}}\n",
        "distributed: {commHook: POWER_SGD}\n"}) {
    EXPECT_TRUE(PlanTraining(Spec(mode), Launch(2)).per_rank_state) << mode;
  }
}

TEST(TrainingPlanTest, GradientSyncAndUpdateTakeTheDistributedSettings) {
  const TrainingPlan plan = PlanTraining(
      Spec("seed: 9\ngradClipNorm: 0.5\ndistributed: {bucketCapMb: 0.5, findUnusedParameters: "
           "true, commHook: POWER_SGD, powerSgd: {matrixApproximationRank: 4}, "
           "shardOptimizerState: true}\n"),
      Launch(2));
  EXPECT_EQ(plan.gradient_sync.bucket_cap_bytes, 1 << 19);
  EXPECT_TRUE(plan.gradient_sync.find_unused_parameters);
  EXPECT_EQ(plan.gradient_sync.comm_hook, Distributed::POWER_SGD);
  EXPECT_EQ(plan.gradient_sync.power_sgd.matrix_approximation_rank(), 4);
  EXPECT_EQ(plan.gradient_sync.power_sgd.start_step(), 10);  // default written in
  EXPECT_EQ(plan.gradient_sync.seed, 9u);
  EXPECT_TRUE(plan.update.shard_optimizer_state);
  EXPECT_DOUBLE_EQ(plan.update.grad_clip_norm, 0.5);
  EXPECT_FALSE(plan.update.local_sgd.has_value());
  const TrainingPlan local =
      PlanTraining(Spec("distributed: {localSgd: {period: 3, warmupSteps: 7}}\n"), Launch(2));
  ASSERT_TRUE(local.update.local_sgd.has_value());
  EXPECT_EQ(local.update.local_sgd->period, 3);
  EXPECT_EQ(local.update.local_sgd->warmup_steps, 7);
}

// --- pipeline stages ---

// Four Linear layers, so that up to 4 stages (or 2 stages x 2 chunks) have one each; batches of
// 12 split into 2, 3, 4 or 6 micro-batches.
v1::JobSpec PipelineSpec(const std::string& parallelism, const std::string& extra = "") {
  return Spec("model: {mlp: {layers: [4, 8, 8, 8, 2]}}\nbatchSizePerRank: 12\nparallelism: {" +
              parallelism + "}\n" + extra);
}

LaunchFacts RankOf(int rank, int world_size, RankDevice device = RankDevice::kCpu) {
  LaunchFacts launch = Launch(world_size, device);
  launch.rank = rank;
  return launch;
}

TEST(TrainingPlanTest, RanksAreReplicaTimesStagesPlusStage) {
  const v1::JobSpec spec = PipelineSpec("pipelineStages: 2");
  const PipelinePlan last = PlanTraining(spec, RankOf(3, 4)).pipeline;
  EXPECT_TRUE(last.enabled());
  EXPECT_EQ(last.stages, 2);
  EXPECT_EQ(last.replicas, 2);
  EXPECT_EQ(last.stage, 1);
  EXPECT_EQ(last.replica, 1);
  EXPECT_TRUE(last.last_stage());
  EXPECT_FALSE(last.first_stage());
  const PipelinePlan first = PlanTraining(spec, RankOf(2, 4)).pipeline;
  EXPECT_EQ(first.stage, 0);
  EXPECT_EQ(first.replica, 1);
}

TEST(TrainingPlanTest, WithoutPipelineEachRankIsAReplica) {
  const PipelinePlan plan = PlanTraining(Spec(), RankOf(2, 3)).pipeline;
  EXPECT_FALSE(plan.enabled());
  EXPECT_EQ(plan.replicas, 3);
  EXPECT_EQ(plan.replica, 2);
  EXPECT_EQ(plan.loss_weight(), 1);
  EXPECT_FALSE(PlanTraining(Spec(), Launch(2)).collective_checkpoint());
}

TEST(TrainingPlanTest, PipelineDefaultsAreWrittenIn) {
  const PipelinePlan plain = PlanTraining(PipelineSpec("pipelineStages: 3"), RankOf(0, 3)).pipeline;
  EXPECT_EQ(plain.micro_batches, 3);  // 0 = the stages
  EXPECT_EQ(plain.chunks_per_stage, 1);
  EXPECT_EQ(plain.schedule, v1::ParallelismSpec::ONE_F_ONE_B);
  EXPECT_EQ(plain.balance, v1::ParallelismSpec::PARAMETERS);
  const PipelinePlan interleaved =
      PlanTraining(PipelineSpec("pipelineStages: 2, schedule: INTERLEAVED_ONE_F_ONE_B"),
                   RankOf(0, 2))
          .pipeline;
  EXPECT_EQ(interleaved.chunks_per_stage, 2);  // 0 = 2
  const PipelinePlan set = PlanTraining(PipelineSpec("pipelineStages: 2, microBatches: 6, "
                                                     "schedule: GPIPE, balance: MEASURED_TIME"),
                                        RankOf(1, 2))
                               .pipeline;
  EXPECT_EQ(set.micro_batches, 6);
  EXPECT_EQ(set.schedule, v1::ParallelismSpec::GPIPE);
  EXPECT_EQ(set.balance, v1::ParallelismSpec::MEASURED_TIME);
}

// A replica's stages read the same samples: the data is split into replicas' shards, and the
// global batch counts replicas, not ranks.
TEST(TrainingPlanTest, TheDataIsShardedByReplica) {
  const TrainingPlan plan = PlanTraining(PipelineSpec("pipelineStages: 2"), RankOf(1, 4));
  EXPECT_EQ(plan.batches.examples_per_rank, 500);  // 1000 over 2 replicas
  EXPECT_EQ(plan.batches.steps_per_epoch, 41);     // 500 / 12, the partial batch dropped
  EXPECT_EQ(plan.global_batch(), 24);
  EXPECT_EQ(PlanTraining(PipelineSpec("pipelineStages: 4"), RankOf(0, 4)).global_batch(), 12);
}

// Micro-batches must be equal, so a pipeline drops an epoch's partial last batch even without
// dataset.dropLast; without a pipeline it is trained.
TEST(TrainingPlanTest, APipelineDropsThePartialLastBatch) {
  EXPECT_EQ(PlanTraining(Spec("batchSizePerRank: 12\n"), Launch()).batches.steps_per_epoch, 84);
  EXPECT_EQ(PlanTraining(PipelineSpec("pipelineStages: 2"), RankOf(0, 2)).batches.steps_per_epoch,
            83);
}

// What the start line reports: the examples of each shard that only the pipeline drops.
TEST(TrainingPlanTest, APipelineCountsTheExamplesItDropsAlthoughDropLastIsFalse) {
  const auto dropped = [](const v1::JobSpec& spec, const LaunchFacts& launch) {
    return PlanTraining(spec, launch).batches.pipeline_dropped_per_epoch;
  };
  EXPECT_EQ(dropped(PipelineSpec("pipelineStages: 2"), RankOf(0, 2)), 4);  // 1000 - 83 x 12
  EXPECT_EQ(dropped(PipelineSpec("pipelineStages: 2"), RankOf(3, 4)), 8);  // 500 - 41 x 12
  // Asked for, or nothing to drop: not counted.
  EXPECT_EQ(dropped(PipelineSpec("pipelineStages: 2", "dataset: {dropLast: true}\n"), RankOf(0, 2)),
            0);
  v1::JobSpec dividing = PipelineSpec("pipelineStages: 2");
  dividing.set_batch_size_per_rank(10);  // 100 batches of 10
  EXPECT_EQ(dropped(dividing, RankOf(0, 2)), 0);
  // Without a pipeline the partial batch is trained.
  EXPECT_EQ(dropped(Spec("batchSizePerRank: 12\n"), Launch()), 0);
}

// What the start line reports: the examples past an epoch's last whole optimizer step, when
// gradAccumulationSteps does not divide the epoch's micro-batches.
TEST(TrainingPlanTest, AccumulationCountsTheMicroBatchesPastTheLastWholeStep) {
  const auto dropped = [](const v1::JobSpec& spec, const LaunchFacts& launch) {
    return PlanTraining(spec, launch).batches.accumulation_dropped_per_epoch;
  };
  // 1000 examples in 84 batches of 12 (the last of 4): 16 steps of 5 take 960; the partial
  // batch and three whole ones are dropped.
  EXPECT_EQ(dropped(Spec("batchSizePerRank: 12\ngradAccumulationSteps: 5\n"), Launch()), 40);
  // With dropLast the partial batch was asked for: 83 whole batches, 16 x 5 of them trained.
  EXPECT_EQ(dropped(Spec("batchSizePerRank: 12\ngradAccumulationSteps: 5\n"
                         "dataset: {dropLast: true}\n"),
                    Launch()),
            36);
  // A pipeline counts its partial batch apart (pipeline_dropped_per_epoch).
  v1::JobSpec pipelined = PipelineSpec("pipelineStages: 2");
  pipelined.set_grad_accumulation_steps(5);
  EXPECT_EQ(dropped(pipelined, RankOf(0, 2)), 36);
  EXPECT_EQ(PlanTraining(pipelined, RankOf(0, 2)).batches.pipeline_dropped_per_epoch, 4);
  // Accumulation that divides the batches (84 = 4 x 21), or none: nothing.
  EXPECT_EQ(dropped(Spec("batchSizePerRank: 12\ngradAccumulationSteps: 4\n"), Launch()), 0);
  EXPECT_EQ(dropped(Spec("batchSizePerRank: 12\n"), Launch()), 0);
}

TEST(TrainingPlanTest, StagesMustDivideTheRanksLaunched) {
  // worldSize unset: the rules see the 3 ranks launched.
  const std::string refusal = Refusal(PipelineSpec("pipelineStages: 2"), RankOf(0, 3));
  EXPECT_TRUE(Contains(refusal, "parallelism.pipelineStages")) << refusal;
  EXPECT_TRUE(Contains(refusal, "divide")) << refusal;
  EXPECT_EQ(Refusal(PipelineSpec("pipelineStages: 2"), RankOf(0, 4)), "(planned)");
  // PlanPipeline alone, as the trainer applies it after the spec's rules.
  try {
    PlanPipeline(WithDefaults(PipelineSpec("pipelineStages: 2")), RankOf(0, 3));
    ADD_FAILURE() << "planned 2 stages over 3 ranks";
  } catch (const UserError& error) {
    EXPECT_EQ(error.field(), "parallelism.pipelineStages");
    EXPECT_TRUE(Contains(error.what(), "2 stages do not divide the 3 ranks launched"))
        << error.what();
  }
}

TEST(TrainingPlanTest, TheInterleavedScheduleIsRefusedOnNccl) {
  const v1::JobSpec spec = PipelineSpec("pipelineStages: 2, schedule: INTERLEAVED_ONE_F_ONE_B");
  const std::string refusal = Refusal(spec, RankOf(0, 2, RankDevice::kCuda));
  EXPECT_TRUE(Contains(refusal, "parallelism.schedule | ")) << refusal;
  EXPECT_TRUE(Contains(refusal, "Gloo only")) << refusal;
  EXPECT_EQ(Refusal(PipelineSpec("pipelineStages: 2"), RankOf(0, 2, RankDevice::kCuda)),
            "(planned)");
}

// Modes with state of each rank's own, or that need the stages to agree, are not built for
// pipelines: refused (the spec's rules refuse them first; the trainer again for a rank started
// by hand).
TEST(TrainingPlanTest, WhatPipelinesLackIsRefused) {
  for (const char* mode :
       {"distributed: {shardOptimizerState: true}\n", "distributed: {localSgd: {period: 4}}\n",
        "distributed: {commHook: POWER_SGD}\n", "precision: FP16\n"}) {
    const std::string refusal =
        Refusal(PipelineSpec("pipelineStages: 2", mode), RankOf(0, 2, RankDevice::kCuda));
    EXPECT_NE(refusal, "(planned)") << mode;
    EXPECT_TRUE(Contains(refusal, "pipeline")) << mode << refusal;
  }
  EXPECT_EQ(Refusal(PipelineSpec("pipelineStages: 2",
                                 "gradClipNorm: 1\nprecision: BF16\n"
                                 "distributed: {commHook: FP16}\n"),
                    RankOf(0, 2)),
            "(planned)");
}

// A replica's loss is known on its stage 0, which stands for all its ranks when the loss is
// averaged over the world; saving needs every stage.
TEST(TrainingPlanTest, StageZeroCarriesItsReplicasLossAndSavingIsACollective) {
  const v1::JobSpec spec = PipelineSpec("pipelineStages: 4");
  EXPECT_EQ(PlanTraining(spec, RankOf(0, 8)).pipeline.loss_weight(), 4);
  EXPECT_EQ(PlanTraining(spec, RankOf(4, 8)).pipeline.loss_weight(), 4);
  EXPECT_EQ(PlanTraining(spec, RankOf(3, 8)).pipeline.loss_weight(), 0);
  EXPECT_TRUE(PlanTraining(spec, RankOf(3, 8)).collective_checkpoint());
}

}  // namespace
}  // namespace gradhub::trainer
