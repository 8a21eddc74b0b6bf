// gradhub-trainer as users and agents run it: real processes, real data, real rendezvous.
#include <gtest/gtest.h>

#include <signal.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <thread>

#include "tests/e2e/trainer/trainer_runs.h"
#include "tests/support/subprocess.h"

namespace gradhub {
namespace {

using testing::BinaryPath;
using testing::DoneField;
using testing::NewestCheckpointStep;
using testing::RunJob;
using testing::RunResult;
using testing::Subprocess;
using testing::TempDir;
using testing::WriteFile;

constexpr char kDigits[] = "/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz";

std::string DigitsSpec(const std::string& dir,
                       const std::string& model = "mlp: {layers: [64, 128, 10]}",
                       const std::string& extra = "maxEpochs: 25\n") {
  return WriteFile(dir + "/digits.yaml", "model: {" + model +
                                             "}\n"
                                             "dataset: {csv: {path: " +
                                             std::string(kDigits) +
                                             ", normalize: standard},"
                                             " validationFraction: 0.2}\n"
                                             "optimizer: {sgd: {lr: 0.05, momentum: 0.9}}\n"
                                             "batchSizePerRank: 32\n"
                                             "logEverySteps: 50\n"
                                             "seed: 1\n" +
                                             extra);
}

class TrainerE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(kDigits)) GTEST_SKIP() << kDigits << " missing (python3-sklearn)";
  }
  TempDir dir_;
};

TEST_F(TrainerE2eTest, DigitsReach95PercentAtWorldSize1And2) {
  const std::string spec = DigitsSpec(dir_.path());
  double accuracy[3] = {0, 0, 0};
  for (int world : {1, 2}) {
    const auto start = std::chrono::steady_clock::now();
    auto results = RunJob(spec, world, dir_.path());
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    for (const auto& result : results) ASSERT_EQ(result.exit_code, 0) << result.err;
    accuracy[world] = std::stod(DoneField(results[0].out, "eval.accuracy"));
    EXPECT_GE(accuracy[world], 0.95) << "world " << world << "\n" << results[0].err;
    EXPECT_LT(seconds, 60) << "world " << world;
  }
  EXPECT_NEAR(accuracy[1], accuracy[2], 0.01);
}

TEST_F(TrainerE2eTest, SameSeedSameParametersBitForBit) {
  const std::string spec =
      DigitsSpec(dir_.path(), "mlp: {layers: [64, 64, 10], dropout: 0.1}", "maxSteps: 150\n");
  for (int world : {1, 2}) {
    auto first = RunJob(spec, world, dir_.path());
    auto second = RunJob(spec, world, dir_.path());
    ASSERT_EQ(first[0].exit_code, 0) << first[0].err;
    ASSERT_EQ(second[0].exit_code, 0) << second[0].err;
    const std::string sha = DoneField(first[0].out, "parametersSha256");
    EXPECT_EQ(sha.size(), 64u);
    EXPECT_EQ(sha, DoneField(second[0].out, "parametersSha256")) << "world " << world;
    if (world == 2) {
      EXPECT_EQ(sha, DoneField(first[1].out, "parametersSha256")) << "ranks differ";
    }
  }
}

TEST_F(TrainerE2eTest, KilledRunResumesFromCheckpointBitForBit) {
  const std::string spec =
      DigitsSpec(dir_.path(), "mlp: {layers: [64, 512, 512, 10], dropout: 0.1}",
                 "maxSteps: 3000\ncheckpoint: {everySteps: 100}\n");
  auto uninterrupted = RunJob(spec, 1, dir_.path());
  ASSERT_EQ(uninterrupted[0].exit_code, 0) << uninterrupted[0].err;

  const std::string checkpoints = dir_.path() + "/ckpt";
  const std::vector<std::string> argv = {BinaryPath("gradhub-trainer"),
                                         "--spec",
                                         spec,
                                         "--threads",
                                         "1",
                                         "--checkpoint-dir",
                                         checkpoints};
  {
    Subprocess victim(argv);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(2);
    while (NewestCheckpointStep(checkpoints) < 200 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    ASSERT_TRUE(victim.running()) << "finished before it could be killed: test is void";
    victim.Kill(SIGKILL);
    EXPECT_EQ(victim.Wait(), 128 + SIGKILL);
  }
  RunResult resumed = testing::Run(argv);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  std::smatch match;
  ASSERT_TRUE(std::regex_search(resumed.err, match, std::regex("resumed from step ([0-9]+)")))
      << resumed.err;
  const int64_t from = std::stoll(match[1]);
  EXPECT_GE(from, 200);
  EXPECT_LT(from, 3000);
  EXPECT_EQ(DoneField(resumed.out, "parametersSha256"),
            DoneField(uninterrupted[0].out, "parametersSha256"));
}

TEST_F(TrainerE2eTest, CorruptCheckpointIsSkipped) {
  const std::string spec =
      DigitsSpec(dir_.path(), "mlp: {layers: [64, 32, 10]}",
                 "maxSteps: 200\ncheckpoint: {everySteps: 100, keepLast: 5}\n");
  const std::string checkpoints = dir_.path() + "/ckpt";
  const std::vector<std::string> argv = {BinaryPath("gradhub-trainer"),
                                         "--spec",
                                         spec,
                                         "--threads",
                                         "1",
                                         "--checkpoint-dir",
                                         checkpoints};
  ASSERT_EQ(testing::Run(argv).exit_code, 0);
  // Flip a byte in the newest checkpoint: the run must fall back to the one before.
  {
    std::fstream file(checkpoints + "/ckpt-200.gh",
                      std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(100);
    file.put('\x7f');
  }
  RunResult again = testing::Run(argv);
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_NE(again.err.find("skipping corrupt checkpoint"), std::string::npos) << again.err;
  EXPECT_NE(again.err.find("resumed from step 100"), std::string::npos) << again.err;
}

// SIGTERM to both ranks of a world-2 run (a preemption, a drain): rank 0 finishes its step,
// commits a checkpoint of it and exits with the preempted code; rank 1 follows. The next run
// resumes from exactly that step and ends with the uninterrupted run's parameters.
TEST_F(TrainerE2eTest, PreemptedRunSavesItsLastStepAndResumesBitForBit) {
  const std::string spec = DigitsSpec(dir_.path(), "mlp: {layers: [64, 256, 10], dropout: 0.1}",
                                      "maxSteps: 1500\ncheckpoint: {everySteps: 1000}\n");
  auto uninterrupted = RunJob(spec, 2, dir_.path());
  ASSERT_EQ(uninterrupted[0].exit_code, 0) << uninterrupted[0].err;

  const std::string checkpoints = dir_.path() + "/ckpt";
  const std::vector<std::string> extra = {"--checkpoint-dir", checkpoints};
  std::vector<std::unique_ptr<Subprocess>> ranks;
  for (int rank = 0; rank < 2; ++rank) {
    ranks.push_back(std::make_unique<Subprocess>(std::vector<std::string>{
        BinaryPath("gradhub-trainer"), "--spec", spec, "--rank", std::to_string(rank),
        "--world-size", "2", "--threads", "1", "--store", "file:" + dir_.path() + "/rdzv2",
        "--checkpoint-dir", checkpoints}));
  }
  // Past the first progress lines, before the periodic checkpoint at 1000.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(2);
  while (ranks[0]->out().find("\"step\":200,") == std::string::npos &&
         std::chrono::steady_clock::now() < deadline && ranks[0]->running()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  for (auto& rank : ranks) rank->Kill(SIGTERM);
  EXPECT_EQ(ranks[0]->Wait(), 13) << ranks[0]->err();
  EXPECT_EQ(ranks[1]->Wait(), 13) << ranks[1]->err();
  std::smatch match;
  const std::string err = ranks[0]->err();
  ASSERT_TRUE(std::regex_search(err, match, std::regex("stopped after step ([0-9]+); checkpoint")))
      << err;
  const std::string stopped_at = match[1];
  EXPECT_LT(std::stoll(stopped_at), 1000) << "should have stopped long before the end";

  auto resumed = RunJob(spec, 2, dir_.path(), extra);
  ASSERT_EQ(resumed[0].exit_code, 0) << resumed[0].err;
  EXPECT_NE(resumed[0].err.find("resumed from step " + stopped_at + "\n"), std::string::npos)
      << resumed[0].err;
  EXPECT_NE(resumed[1].err.find("resumed from step " + stopped_at + "\n"), std::string::npos)
      << "rank 1 gets the state from rank 0\n"
      << resumed[1].err;
  EXPECT_EQ(DoneField(resumed[0].out, "parametersSha256"),
            DoneField(uninterrupted[0].out, "parametersSha256"));
}

// SIGTERM before the loop's first step (here: rank 0 of a world of 2 waiting for a peer that
// never comes) has nothing to save: the rank leaves at once with the preempted code, instead
// of waiting out its rendezvous (a minute here) or, under an agent, the stop grace.
TEST_F(TrainerE2eTest, SigtermBeforeTheFirstStepEndsTheRankAtOnce) {
  const std::string spec = DigitsSpec(dir_.path(), "mlp: {layers: [64, 32, 10]}", "maxSteps: 10\n");
  Subprocess rank({BinaryPath("gradhub-trainer"), "--spec", spec, "--rank", "0", "--world-size",
                   "2", "--threads", "1", "--collective-timeout", "60s", "--store",
                   "file:" + dir_.path() + "/rdzv-alone"});
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (rank.err().find("GRADHUB_DEVICE=") == std::string::npos &&
         std::chrono::steady_clock::now() < deadline && rank.running()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // into the rendezvous
  const auto sent = std::chrono::steady_clock::now();
  rank.Kill(SIGTERM);
  EXPECT_EQ(rank.Wait(), 13) << rank.err();
  EXPECT_LT(std::chrono::steady_clock::now() - sent, std::chrono::seconds(5));
  EXPECT_NE(rank.err().find("stopped (SIGTERM) before training began"), std::string::npos)
      << rank.err();
}

// A checkpoint remembers the spec that wrote it: a change that alters the result (the
// learning rate) is refused as a user error naming the field; a harmless one (training
// longer, evaluating more often) resumes.
TEST_F(TrainerE2eTest, ResumeRefusesAChangedSpecButNotAHarmlessChange) {
  const std::string model = "mlp: {layers: [64, 32, 10]}";
  const std::string checkpoints = dir_.path() + "/ckpt";
  auto run = [&](const std::string& spec) {
    return testing::Run({BinaryPath("gradhub-trainer"), "--spec", spec, "--threads", "1",
                         "--checkpoint-dir", checkpoints});
  };
  ASSERT_EQ(run(DigitsSpec(dir_.path(), model, "maxSteps: 100\n")).exit_code, 0);

  RunResult changed = run(
      WriteFile(dir_.path() + "/lr.yaml", "model: {" + model +
                                              "}\n"
                                              "dataset: {csv: {path: " +
                                              std::string(kDigits) +
                                              ", normalize: standard}, validationFraction: 0.2}\n"
                                              "optimizer: {sgd: {lr: 0.07, momentum: 0.9}}\n"
                                              "batchSizePerRank: 32\nmaxSteps: 200\nseed: 1\n"));
  EXPECT_EQ(changed.exit_code, 10) << changed.err;
  EXPECT_NE(changed.err.find("spec: changed since the checkpoint"), std::string::npos)
      << changed.err;
  EXPECT_NE(changed.err.find("lr"), std::string::npos) << changed.err;

  RunResult longer = run(DigitsSpec(dir_.path(), model, "maxSteps: 200\nevalEverySteps: 40\n"));
  EXPECT_EQ(longer.exit_code, 0) << longer.err;
  EXPECT_NE(longer.err.find("resumed from step 100"), std::string::npos) << longer.err;
}

TEST_F(TrainerE2eTest, ExitCodesTellUserErrorsApart) {
  RunResult bad_spec =
      testing::Run({BinaryPath("gradhub-trainer"), "--spec",
                    WriteFile(dir_.path() + "/bad.yaml",
                              "model: {mlp: {layers: [64]}}\nbatchSizePerRank: 0\n")});
  EXPECT_EQ(bad_spec.exit_code, 10) << bad_spec.err;
  EXPECT_NE(bad_spec.err.find("model.mlp.layers"), std::string::npos) << bad_spec.err;
  EXPECT_NE(bad_spec.err.find("batchSizePerRank"), std::string::npos) << bad_spec.err;

  RunResult missing_data = testing::Run(
      {BinaryPath("gradhub-trainer"), "--spec",
       WriteFile(dir_.path() + "/missing.yaml",
                 "model: {mlp: {layers: [64, 10]}}\ndataset: {csv: {path: /nonexistent.csv}}\n"
                 "optimizer: {sgd: {lr: 0.1}}\nbatchSizePerRank: 8\nmaxSteps: 1\n")});
  EXPECT_EQ(missing_data.exit_code, 10) << missing_data.err;
  EXPECT_NE(missing_data.err.find("/nonexistent.csv"), std::string::npos) << missing_data.err;

  RunResult nan = testing::Run({BinaryPath("gradhub-trainer"), "--spec",
                                DigitsSpec(dir_.path(), "mlp: {layers: [64, 10]}",
                                           "maxSteps: 50\n"
                                           "lrSchedule: {step: {stepSize: 1, gamma: 1e30}}\n")});
  EXPECT_EQ(nan.exit_code, 11) << nan.err;
  EXPECT_NE(nan.err.find("at step"), std::string::npos) << nan.err;
}

TEST_F(TrainerE2eTest, TorchScriptModelFromPythonTrains) {
  const std::string model = dir_.path() + "/model.pt";
  const std::string script =
      "import torch\n"
      "m = torch.jit.script(torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(),"
      " torch.nn.Linear(32, 10)))\n"
      "m.save('" +
      model + "')\n";
  WriteFile(dir_.path() + "/make_model.py", script);
  RunResult made = testing::Run({"/usr/bin/python3", dir_.path() + "/make_model.py"});
  if (made.exit_code != 0) GTEST_SKIP() << "Debian's python3-torch unavailable: " << made.err;
  RunResult run = testing::Run(
      {BinaryPath("gradhub-trainer"), "--threads", "1", "--spec",
       DigitsSpec(dir_.path(), "torchscript: {path: " + model + "}", "maxSteps: 300\n")});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  std::smatch first;
  ASSERT_TRUE(std::regex_search(
      run.out, first, std::regex(R"("event":"progress","step":50,[^}]*"loss":([0-9.e-]+))")))
      << run.out;
  const double early = std::stod(first[1]);
  const double late = std::stod(DoneField(run.out, "loss"));
  EXPECT_LT(late, early * 0.5) << run.out;
  EXPECT_GE(std::stod(DoneField(run.out, "eval.accuracy")), 0.9);
}

TEST_F(TrainerE2eTest, CharacterTransformerLearnsEnglish) {
  // Over 250 KB of English prose that every Debian machine has.
  std::string corpus;
  for (const auto& entry : std::filesystem::directory_iterator("/usr/share/common-licenses")) {
    if (!entry.is_regular_file()) continue;
    std::ifstream in(entry.path());
    corpus.append(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  ASSERT_GE(corpus.size(), 100u * 1024);
  const std::string text = WriteFile(dir_.path() + "/corpus.txt", corpus);
  const std::string spec =
      WriteFile(dir_.path() + "/lm.yaml",
                "model: {transformer: {contextLength: 32, dModel: 64, layers: 2, heads: 4}}\n"
                "dataset: {text: {path: " +
                    text +
                    "}, validationFraction: 0.02}\n"
                    "optimizer: {adamw: {lr: 0.003, weightDecay: 0.0}}\n"
                    "lrSchedule: {cosine: {minLr: 0.0003}, warmupSteps: 50}\n"
                    "batchSizePerRank: 32\nmaxSteps: 1200\nlogEverySteps: 200\nseed: 3\n");
  RunResult run = testing::Run({BinaryPath("gradhub-trainer"), "--spec", spec, "--threads", "2"},
                               {}, std::chrono::minutes(10));
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const double loss = std::stod(DoneField(run.out, "eval.loss"));
  EXPECT_LT(loss, 2.0) << run.err;
}

// precision: BF16 runs forward and loss under autocast to bfloat16 (weights and optimizer
// state stay float32): the digits MLP and a small CNN end within 1% validation accuracy of
// their FP32 runs, and the parameters differ, so bfloat16 really ran.
// The CNN at lr 0.01: at 0.05 its FP32 run is unstable and ends anywhere between 0.89 and
// 0.96 (BF16 then lands 2-4% above it), which measures that instability, not bfloat16.
TEST_F(TrainerE2eTest, Bf16AccuracyWithinOnePercentOfFp32) {
  const std::pair<std::string, std::string> models[] = {
      {"mlp: {layers: [64, 128, 10]}", "0.05"}, {"cnn: {channels: [6, 16], hidden: 64}", "0.01"}};
  for (const auto& [model, lr] : models) {
    double accuracy[2] = {0, 0};
    std::string sha[2];
    for (int bf16 : {0, 1}) {
      const std::string spec = WriteFile(dir_.path() + "/precision.yaml",
                                         "model: {" + model +
                                             "}\n"
                                             "dataset: {csv: {path: " +
                                             std::string(kDigits) +
                                             ", normalize: standard},"
                                             " validationFraction: 0.2}\n"
                                             "optimizer: {sgd: {lr: " +
                                             lr +
                                             ", momentum: 0.9}}\n"
                                             "batchSizePerRank: 32\nmaxEpochs: 20\nseed: 1\n" +
                                             (bf16 ? "precision: BF16\n" : ""));
      auto results = RunJob(spec, 1, dir_.path());
      ASSERT_EQ(results[0].exit_code, 0) << results[0].err;
      accuracy[bf16] = std::stod(DoneField(results[0].out, "eval.accuracy"));
      sha[bf16] = DoneField(results[0].out, "parametersSha256");
    }
    std::printf("%s: validation accuracy FP32 %.4f BF16 %.4f\n", model.c_str(), accuracy[0],
                accuracy[1]);
    EXPECT_GE(accuracy[0], 0.9) << model;
    EXPECT_NEAR(accuracy[1], accuracy[0], 0.01) << model;
    EXPECT_NE(sha[0], sha[1]) << model << ": BF16 trained exactly as FP32 (autocast off?)";
  }
}

TEST_F(TrainerE2eTest, Fp16IsRefusedOnCpuNamingPrecision) {
  RunResult run = testing::Run(
      {BinaryPath("gradhub-trainer"), "--threads", "1", "--spec",
       DigitsSpec(dir_.path(), "mlp: {layers: [64, 10]}", "maxSteps: 5\nprecision: FP16\n")});
  EXPECT_EQ(run.exit_code, 10) << run.err;
  EXPECT_NE(run.err.find("precision: FP16"), std::string::npos) << run.err;
  EXPECT_NE(run.err.find("CUDA"), std::string::npos) << run.err;
}

// The agent tells a rank its node's kind (--device, GRADHUB_DEVICE) and what backend AUTO
// became there (--backend, GRADHUB_BACKEND); the spec's explicit backend wins.
TEST_F(TrainerE2eTest, NcclOnACpuNodeIsAUserErrorNamingTheBackend) {
  const std::string spec = DigitsSpec(dir_.path(), "mlp: {layers: [64, 10]}",
                                      "maxSteps: 5\ndistributed: {backend: NCCL}\n");
  for (const std::vector<std::string>& device :
       {std::vector<std::string>{}, std::vector<std::string>{"--device", "cpu"}}) {
    std::vector<std::string> argv = {BinaryPath("gradhub-trainer"), "--threads", "1", "--spec",
                                     spec};
    argv.insert(argv.end(), device.begin(), device.end());
    RunResult run = testing::Run(argv);
    EXPECT_EQ(run.exit_code, 10) << run.err;
    EXPECT_NE(run.err.find("distributed.backend"), std::string::npos) << run.err;
    EXPECT_NE(run.err.find("NCCL needs a GPU node"), std::string::npos) << run.err;
  }
  RunResult bad = testing::Run({BinaryPath("gradhub-trainer"), "--spec", spec, "--device", "tpu"});
  EXPECT_EQ(bad.exit_code, 10) << bad.err;
  EXPECT_NE(bad.err.find("--device"), std::string::npos) << bad.err;
}

// A rank told it has a GPU that it cannot use fails as the node's fault (exit 12), naming the
// device it was given, before any training.
TEST_F(TrainerE2eTest, GpuRankWithoutAUsableGpuIsAnInfrastructureFailure) {
  if (std::filesystem::exists("/proc/driver/nvidia/version")) GTEST_SKIP() << "a GPU is here";
  RunResult run = testing::Run(
      {BinaryPath("gradhub-trainer"), "--threads", "1", "--device", "cuda", "--backend", "NCCL",
       "--spec", DigitsSpec(dir_.path(), "mlp: {layers: [64, 10]}", "maxSteps: 5\n")},
      {{"CUDA_VISIBLE_DEVICES", "1"}});
  EXPECT_EQ(run.exit_code, 12) << run.err;
  EXPECT_NE(run.err.find("GRADHUB_DEVICE=cuda GRADHUB_BACKEND=NCCL CUDA_VISIBLE_DEVICES=1"),
            std::string::npos)
      << run.err;
  EXPECT_NE(run.err.find("no GPU: this rank was given a GPU"), std::string::npos) << run.err;
}

// Gloo reduces CPU tensors, so a Gloo job on a GPU node trains on the CPU.
TEST_F(TrainerE2eTest, GlooOnAGpuNodeTrainsOnTheCpu) {
  RunResult run = testing::Run(
      {BinaryPath("gradhub-trainer"), "--threads", "1", "--device", "cuda", "--backend", "GLOO",
       "--spec", DigitsSpec(dir_.path(), "mlp: {layers: [64, 10]}", "maxSteps: 5\n")});
  EXPECT_EQ(run.exit_code, 0) << run.err;
  EXPECT_NE(run.err.find("trains on cpu with Gloo"), std::string::npos) << run.err;
}

// Every mode whose ranks hold state of their own (ZeRO's optimizer shards, local SGD's
// replicas between averages, PowerSGD's error feedback and warm-start Q) resumes bit for bit
// at world size 2: 100 steps, then the same spec continued to 200 from the checkpoint of step
// 100 (maxSteps is a harmless change), ends with the uninterrupted 200-step run's parameters
// on every rank. Local SGD's period 7 leaves the ranks apart at step 100.
TEST_F(TrainerE2eTest, ShardedAndPerRankModesResumeBitForBit) {
  for (const std::string& mode :
       {std::string("distributed: {shardOptimizerState: true}\n"),
        std::string("distributed: {localSgd: {period: 7, warmupSteps: 20}}\n"),
        std::string("distributed: {commHook: POWER_SGD, powerSgd: {startStep: 30, "
                    "matrixApproximationRank: 2}}\n")}) {
    const std::string model = "mlp: {layers: [64, 128, 10], dropout: 0.1}";
    const std::string checkpoints =
        dir_.path() + "/ckpt-" + std::to_string(std::hash<std::string>()(mode));
    auto uninterrupted =
        RunJob(DigitsSpec(dir_.path(), model, mode + "maxSteps: 200\n"), 2, dir_.path());
    ASSERT_EQ(uninterrupted[0].exit_code, 0) << mode << uninterrupted[0].err;
    ASSERT_EQ(uninterrupted[1].exit_code, 0) << mode << uninterrupted[1].err;
    auto first = RunJob(DigitsSpec(dir_.path(), model, mode + "maxSteps: 100\n"), 2, dir_.path(),
                        {"--checkpoint-dir", checkpoints});
    ASSERT_EQ(first[0].exit_code, 0) << mode << first[0].err;
    auto resumed = RunJob(DigitsSpec(dir_.path(), model, mode + "maxSteps: 200\n"), 2, dir_.path(),
                          {"--checkpoint-dir", checkpoints});
    for (int rank = 0; rank < 2; ++rank) {
      ASSERT_EQ(resumed[rank].exit_code, 0) << mode << resumed[rank].err;
      EXPECT_NE(resumed[rank].err.find("resumed from step 100"), std::string::npos)
          << mode << resumed[rank].err;
      EXPECT_EQ(DoneField(resumed[rank].out, "parametersSha256"),
                DoneField(uninterrupted[rank].out, "parametersSha256"))
          << mode << "rank " << rank;
    }
    EXPECT_NE(DoneField(resumed[0].out, "optimizerStateBytes"), "") << resumed[0].out;
  }
}

}  // namespace
}  // namespace gradhub
