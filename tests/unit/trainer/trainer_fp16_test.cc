// precision FP16's loss scaling in the trainer, on the CPU: TrainerOptions'
// fp16_scaling_on_cpu_for_test runs the FP16 path without autocast (the CPU's has no float16),
// so compute stays float32 and only the scaler acts. The scale is a power of two, so scaled
// and unscaled gradients are exact: without an overflow the run must equal FP32 bit for bit.
// Autocast to float16 itself needs a GPU and is not tested here.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <mutex>
#include <sstream>

#include "gpu_worker/ddp/store/in_memory_store.h"
#include "gpu_worker/trainer/checkpoint_state.h"
#include "gpu_worker/trainer/trainer.h"
#include "services/common/contract/job_spec.h"
#include "services/common/contract/progress_record.h"
#include "services/common/contract/user_error.h"

namespace gradhub::trainer {
namespace {

constexpr char kClassification[] =
    "model: {mlp: {layers: [16, 32, 4]}}\n"
    "dataset: {synthetic: {numSamples: 512, numFeatures: 16, numClasses: 4, noise: 0.5}}\n";
// Targets in the thousands: the gradients are too, and overflow float32 at a scale of 2^127.
constexpr char kLargeRegression[] =
    "model: {mlp: {layers: [16, 32, 1]}}\n"
    "dataset: {synthetic: {task: REGRESSION, numSamples: 512, numFeatures: 16, noise: 1000}}\n";

// Two micro-batches per step and clipping: the scaled loss is divided by the accumulation and
// the gradients are clipped after unscaling, both of which must stay exact.
v1::JobSpec Spec(const std::string& precision, int64_t max_steps, const std::string& extra = "",
                 const std::string& model_and_data = kClassification) {
  return ParseJobSpec(model_and_data +
                      "optimizer: {sgd: {lr: 0.05, momentum: 0.9}}\n"
                      "batchSizePerRank: 16\n"
                      "gradAccumulationSteps: 2\n"
                      "gradClipNorm: 1.0\n"
                      "logEverySteps: 2\n"
                      "seed: 3\n"
                      "maxSteps: " +
                      std::to_string(max_steps) + "\nprecision: " + precision + "\n" + extra);
}

// Keeps every checkpoint in memory; the trainer saves on a background thread.
class MemorySink : public CheckpointSink {
 public:
  void Save(const Checkpoint& checkpoint) override {
    std::lock_guard<std::mutex> lock(mutex_);
    latest_ = checkpoint;
  }
  std::optional<Checkpoint> LoadLatest() override {
    std::lock_guard<std::mutex> lock(mutex_);
    return latest_;
  }

 private:
  std::mutex mutex_;
  std::optional<Checkpoint> latest_;
};

struct Outcome {
  TrainResult result;
  std::string progress, log;
  std::optional<ProgressRecord> done;
};

Outcome Train(const v1::JobSpec& spec, std::optional<ddp::LossScalerOptions> scaler,
              std::shared_ptr<CheckpointSink> checkpoints = nullptr) {
  std::ostringstream progress, log;
  TrainerOptions options;
  options.store = std::make_shared<ddp::InMemoryStore>();
  options.threads = 1;
  options.checkpoints = std::move(checkpoints);
  options.progress = &progress;
  options.log = &log;
  options.fp16_scaling_on_cpu_for_test = scaler;
  Outcome run;
  run.result = trainer::Train(spec, options);
  run.progress = progress.str();
  run.log = log.str();
  std::istringstream lines(run.progress);
  for (std::string line; std::getline(lines, line);) {
    std::optional<ProgressRecord> record = ParseProgressRecord(line);
    if (record && record->event == ProgressEvent::kDone) run.done = record;
  }
  return run;
}

ddp::LossScalerOptions Scaler(double init_scale, int64_t growth_interval = 2000,
                              double backoff_factor = 0.5) {
  ddp::LossScalerOptions options;
  options.init_scale = init_scale;
  options.growth_interval = growth_interval;
  options.backoff_factor = backoff_factor;
  return options;
}

TEST(TrainerFp16Test, WithoutOverflowTrainsExactlyAsFp32) {
  const Outcome fp32 = Train(Spec("FP32", 8), std::nullopt);
  // Grows twice in 8 steps: 1024 -> 2048 (step 3) -> 4096 (step 6).
  const Outcome fp16 = Train(Spec("FP16", 8), Scaler(1024, /*growth_interval=*/3));
  EXPECT_EQ(fp16.result.parameters_sha256, fp32.result.parameters_sha256);
  EXPECT_EQ(fp16.result.final_loss, fp32.result.final_loss);
  EXPECT_EQ(fp16.result.skipped_steps, 0);
  EXPECT_EQ(fp16.result.loss_scale, 4096);
  ASSERT_TRUE(fp16.done.has_value()) << fp16.progress;
  EXPECT_EQ(fp16.done->loss_scale, 4096);
  EXPECT_EQ(fp16.done->skipped_steps, 0);
  EXPECT_NE(fp16.progress.find(R"("lossScale":2048,"skippedSteps":0)"), std::string::npos)
      << fp16.progress;
  // Other precisions' lines are as they were.
  EXPECT_EQ(fp32.progress.find("lossScale"), std::string::npos) << fp32.progress;
  EXPECT_EQ(fp32.progress.find("skippedSteps"), std::string::npos) << fp32.progress;
}

// A scale near float32's largest overflows the large gradients: the step is skipped on the
// parameters (and the optimizer state), counted, and the scale halves. The loss itself is
// finite, so the run does not fail.
TEST(TrainerFp16Test, OverflowSkipsTheStepAndBacksOff) {
  const double huge = std::ldexp(1.0, 127);
  const Outcome one = Train(Spec("FP16", 1, "", kLargeRegression), Scaler(huge));
  EXPECT_EQ(one.result.steps, 1);
  EXPECT_EQ(one.result.skipped_steps, 1);
  EXPECT_EQ(one.result.loss_scale, std::ldexp(1.0, 126));
  EXPECT_TRUE(std::isfinite(one.result.final_loss));
  ASSERT_TRUE(one.done.has_value()) << one.progress;
  EXPECT_EQ(one.done->skipped_steps, 1);
  EXPECT_NE(one.log.find("step 1 skipped"), std::string::npos) << one.log;
  // Parameters unchanged: a second skipped step (the scale barely backs off) ends with the
  // same parameters, which a step applied would have changed (as FP32's first step does).
  const Outcome two =
      Train(Spec("FP16", 2, "", kLargeRegression), Scaler(huge, 2000, /*backoff_factor=*/0.9));
  EXPECT_EQ(two.result.skipped_steps, 2);
  EXPECT_EQ(two.result.parameters_sha256, one.result.parameters_sha256);
  const Outcome fp32 = Train(Spec("FP32", 1, "", kLargeRegression), std::nullopt);
  EXPECT_NE(fp32.result.parameters_sha256, one.result.parameters_sha256);
}

// A run stopped at step 4 and resumed continues with the scaler's state from the checkpoint:
// the same scale, growth count and skipped steps as the uninterrupted run.
TEST(TrainerFp16Test, ResumeRestoresTheLossScaler) {
  const ddp::LossScalerOptions scaler = Scaler(1024, /*growth_interval=*/3);
  const Outcome whole = Train(Spec("FP16", 8), scaler);
  auto sink = std::make_shared<MemorySink>();
  Train(Spec("FP16", 4), scaler, sink);
  const Outcome resumed = Train(Spec("FP16", 8), scaler, sink);
  EXPECT_EQ(resumed.result.resumed_from_step, 4);
  EXPECT_EQ(resumed.result.loss_scale, whole.result.loss_scale);  // restarted: 2048
  EXPECT_EQ(resumed.result.skipped_steps, whole.result.skipped_steps);
  EXPECT_EQ(resumed.result.parameters_sha256, whole.result.parameters_sha256);
}

TEST(TrainerFp16Test, CheckpointRoundTripsTheScalerState) {
  torch::nn::Linear module(3, 2);
  const v1::JobSpec spec = WithDefaults(Spec("FP16", 1));
  ddp::LossScaler saved;
  saved.set_state(ddp::LossScaler::State{32768, 7, 3});
  SharedUpdateState with_scaler;
  with_scaler.loss_scaler = &saved;
  const std::string bytes = SerializeState(*module, with_scaler, 5, spec);
  ddp::LossScaler loaded;
  SharedUpdateState into;
  into.loss_scaler = &loaded;
  EXPECT_EQ(RestoreState(bytes, *module, into, spec), 5);
  EXPECT_EQ(loaded.state().scale, 32768);
  EXPECT_EQ(loaded.state().growth_tracker, 7);
  EXPECT_EQ(loaded.state().skipped_steps, 3);
  // A checkpoint without one (before FP16, or another precision) leaves the state as it was.
  const std::string old = SerializeState(*module, SharedUpdateState{}, 5, spec);
  ddp::LossScaler initial;
  into.loss_scaler = &initial;
  RestoreState(old, *module, into, spec);
  EXPECT_EQ(initial.state().scale, 65536);
  EXPECT_EQ(initial.state().growth_tracker, 0);
  EXPECT_EQ(initial.state().skipped_steps, 0);
}

// The UserError's message (which starts with its field), or "(not refused)".
std::string Refusal(const v1::JobSpec& spec,
                    std::optional<ddp::LossScalerOptions> scaler = ddp::LossScalerOptions{}) {
  try {
    Train(spec, scaler);
  } catch (const UserError& error) {
    return error.what();
  }
  return "(not refused)";
}

// On the CPU the trainer refuses FP16 (CheckRankDevice); with local SGD or POWER_SGD the spec
// rules refuse it (CheckJobSpec, as CreateJob does), wherever the rank runs.
TEST(TrainerFp16Test, RefusedOnTheCpuAndWithPerRankDistributedState) {
  EXPECT_EQ(Refusal(Spec("FP16", 1), std::nullopt).rfind("precision: FP16", 0), 0u);
  const std::string local_sgd = Refusal(Spec("FP16", 1, "distributed: {localSgd: {period: 2}}\n"));
  EXPECT_NE(local_sgd.find("distributed.localSgd: cannot be combined with precision FP16"),
            std::string::npos)
      << local_sgd;
  const std::string powersgd = Refusal(Spec("FP16", 1, "distributed: {commHook: POWER_SGD}\n"));
  EXPECT_NE(powersgd.find("distributed.commHook: POWER_SGD cannot be combined"), std::string::npos)
      << powersgd;
}

// Optimizer sharding works with FP16 (every rank skips the same steps); at world size 1 it
// trains as without it.
TEST(TrainerFp16Test, ShardedOptimizerStateTrainsAsUnsharded) {
  const ddp::LossScalerOptions scaler = Scaler(1024);
  const Outcome plain = Train(Spec("FP16", 4), scaler);
  const Outcome sharded =
      Train(Spec("FP16", 4, "distributed: {shardOptimizerState: true}\n"), scaler);
  EXPECT_EQ(sharded.result.parameters_sha256, plain.result.parameters_sha256);
}

}  // namespace
}  // namespace gradhub::trainer
