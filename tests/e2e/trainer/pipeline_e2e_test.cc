// Pipeline model parallelism (JobSpec.parallelism) as real trainer processes run it: S stages
// x D replicas of gradhub-trainer over a file store, against one process on the global batch.
//
// A pipelined job costs some 10 s here (mostly starting its processes), so ctest runs a subset
// of the acceptance matrix that still covers every stage count, replica count, model and
// schedule; GRADHUB_PIPELINE_FULL_MATRIX=1 runs all of it, 8-rank shapes (S=4 x D=2)
// included.
#include <gtest/gtest.h>

#include <signal.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
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
using testing::StartJob;
using testing::Subprocess;
using testing::TempDir;
using testing::WriteFile;

constexpr char kDigits[] = "/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz";
constexpr double kTolerance = 1e-5;

// Four layers each, so that 4 stages (or 2 stages x 2 chunks) have one each.
const char kMlp[] = "mlp: {layers: [64, 64, 64, 32, 10]}";
const char kTransformer[] = "transformer: {contextLength: 16, dModel: 32, layers: 2, heads: 2}";

// The parameters a run ended with (rank_model.h DumpParameters), by name.
using Parameters = std::map<std::string, std::vector<double>>;

void ReadDump(const std::string& path, Parameters& parameters) {
  std::ifstream in(path);
  ASSERT_TRUE(in) << path;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string name;
    int64_t count = 0;
    fields >> name >> count;
    std::vector<double>& values = parameters[name];
    values.resize(static_cast<size_t>(count));
    for (double& value : values) fields >> value;
    ASSERT_FALSE(fields.fail()) << path << ": " << name;
  }
}

// The whole model's parameters from the dumps of ranks [first, first + count).
Parameters ReadRanks(const std::string& dir, int first, int count) {
  Parameters parameters;
  for (int rank = first; rank < first + count; ++rank) {
    ReadDump(dir + "/rank-" + std::to_string(rank) + ".txt", parameters);
  }
  return parameters;
}

// The largest difference between two runs' parameters; a failure when they name others.
double MaxDifference(const Parameters& run, const Parameters& reference) {
  EXPECT_EQ(run.size(), reference.size());
  double largest = 0;
  for (const auto& [name, values] : reference) {
    const auto found = run.find(name);
    if (found == run.end() || found->second.size() != values.size()) {
      ADD_FAILURE() << name << " missing or of another size";
      return INFINITY;
    }
    for (size_t i = 0; i < values.size(); ++i) {
      largest = std::max(largest, std::abs(found->second[i] - values[i]));
    }
  }
  return largest;
}

std::string Corpus(const std::string& dir) {
  std::string corpus;
  for (const auto& entry : std::filesystem::directory_iterator("/usr/share/common-licenses")) {
    if (!entry.is_regular_file()) continue;
    std::ifstream in(entry.path());
    corpus.append(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  return WriteFile(dir + "/corpus.txt", corpus);
}

struct Shape {
  const char* model;
  int stages, replicas;
  const char* schedule;
  std::string parallelism = "";  // more of the pipelined run's parallelism, e.g. ", balance: X"
  std::string extra = "";        // in both the pipelined run's spec and the reference's
  int micro_batches = 4;

  std::string Name() const {
    std::string name = std::string(model).substr(0, model[0] == 'm' ? 3 : 11) +
                       " S=" + std::to_string(stages) + " D=" + std::to_string(replicas) + " " +
                       schedule + parallelism + " " + extra;
    while (name.back() == '\n' || name.back() == ' ') name.pop_back();
    return name;
  }
};

class PipelineE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(kDigits)) GTEST_SKIP() << kDigits << " missing (python3-sklearn)";
  }

  // A spec of `model` on its data (digits, or English text for the transformer), SGD with
  // momentum, `batch` samples a rank, no dropout; `extra` merged in.
  std::string Spec(const std::string& file, const std::string& model, int batch,
                   const std::string& extra) {
    const bool text = model.rfind("transformer", 0) == 0;
    if (text && corpus_.empty()) corpus_ = Corpus(dir_.path());
    const std::string dataset = text ? "{text: {path: " + corpus_ + "}, validationFraction: 0.01}"
                                     : "{csv: {path: " + std::string(kDigits) +
                                           ", normalize: standard}, validationFraction: 0.2}";
    return WriteFile(dir_.path() + "/" + file, "model: {" + model + "}\ndataset: " + dataset +
                                                   "\noptimizer: {sgd: {lr: 0.05, momentum: 0.9}}\n"
                                                   "batchSizePerRank: " +
                                                   std::to_string(batch) +
                                                   "\nlogEverySteps: 25\nseed: 1\n" + extra);
  }

  std::string PipelineSpec(const std::string& file, const Shape& shape, const std::string& extra) {
    return Spec(file, shape.model, 8,
                "parallelism: {pipelineStages: " + std::to_string(shape.stages) +
                    ", microBatches: " + std::to_string(shape.micro_batches) + ", schedule: " +
                    shape.schedule + shape.parallelism + "}\n" + shape.extra + extra);
  }

  // Runs the job and returns each rank's result, its parameters dumped under `dump`.
  std::vector<RunResult> Run(const std::string& spec, int world, const std::string& dump,
                             std::vector<std::string> extra = {}) {
    std::filesystem::create_directories(dump);
    extra.insert(extra.end(), {"--dump-parameters", dump});
    std::vector<RunResult> results = RunJob(spec, world, dir_.path(), extra);
    for (size_t rank = 0; rank < results.size(); ++rank) {
      EXPECT_EQ(results[rank].exit_code, 0) << "rank " << rank << "\n" << results[rank].err;
    }
    return results;
  }

  // The reference of `shape`: one process, the global batch (8 x D), no pipeline.
  const Parameters& Reference(const Shape& shape, double* loss) {
    const std::string key = std::string(shape.model) + std::to_string(shape.replicas) + shape.extra;
    if (!references_.count(key)) {
      const std::string dump = dir_.path() + "/reference-" + std::to_string(references_.size());
      const auto results = Run(
          Spec("reference.yaml", shape.model, 8 * shape.replicas, shape.extra + "maxSteps: 50\n"),
          1, dump);
      references_[key] = ReadRanks(dump, 0, 1);
      losses_[key] = DoneField(results[0].out, "eval.loss");
    }
    *loss = std::stod(losses_[key]);
    return references_[key];
  }

  // Trains `shape` for 50 steps and compares it with the reference.
  void ExpectEqualsOneProcess(const Shape& shape) {
    SCOPED_TRACE(shape.Name());
    double reference_loss = 0;
    const Parameters& reference = Reference(shape, &reference_loss);
    const std::string dump = dir_.path() + "/run-" + std::to_string(++runs_);
    const int world = shape.stages * shape.replicas;
    const auto results = Run(PipelineSpec("pipeline.yaml", shape, "maxSteps: 50\n"), world, dump);
    if (HasFailure()) return;
    const double difference = MaxDifference(ReadRanks(dump, 0, shape.stages), reference);
    std::printf("%-48s max |difference| %.3g\n", shape.Name().c_str(), difference);
    last_out_ = results[0].out;
    EXPECT_LE(difference, kTolerance);
    for (int replica = 1; replica < shape.replicas; ++replica) {
      EXPECT_EQ(MaxDifference(ReadRanks(dump, replica * shape.stages, shape.stages),
                              ReadRanks(dump, 0, shape.stages)),
                0)
          << "replica " << replica << " differs from replica 0";
    }
    // Evaluation runs through the stages: every rank reports the reference's validation loss.
    // Every rank logs its stage's layers.
    for (int rank = 0; rank < world; ++rank) {
      const std::string stage = "stage " + std::to_string(rank % shape.stages + 1) + "/" +
                                std::to_string(shape.stages) + ": layers ";
      EXPECT_NE(results[rank].err.find(stage), std::string::npos) << results[rank].err;
      const std::string loss = DoneField(results[rank].out, "eval.loss");
      ASSERT_FALSE(loss.empty()) << "rank " << rank << results[rank].out;
      EXPECT_NEAR(std::stod(loss), reference_loss, 1e-4 * reference_loss) << "rank " << rank;
    }
  }

  // A pipelined run of `shape` killed (SIGKILL, every rank) after a checkpoint resumes from
  // it, every stage from its own part, and ends bit for bit where the uninterrupted run ends.
  // Returns the resumed run's results and, in `killed_err`, what the killed run's ranks logged.
  std::vector<RunResult> KillAndResume(const Shape& shape, std::vector<std::string>* killed_err);

  TempDir dir_;
  std::string corpus_;
  std::map<std::string, Parameters> references_;
  std::map<std::string, std::string> losses_;
  int runs_ = 0;
  std::string last_out_;  // rank 0's of the last run
};

// The acceptance of issue 33: S = 2 and 4 stages by D = 1 and 2 replicas, the MLP and the
// transformer, GPipe and 1F1B, end 50 steps within 1e-5 of one process on the global batch.
// Beside the matrix: interleaved 1F1B, measured-time balance, and clipping to the norm over
// all stages.
std::vector<Shape> Matrix(const char* model) {
  std::vector<Shape> shapes;
  for (const char* schedule : {"GPIPE", "ONE_F_ONE_B"}) {
    shapes.push_back({model, 2, 1, schedule});
    shapes.push_back({model, 2, 2, schedule});
    shapes.push_back({model, 4, 1, schedule});
    shapes.push_back({model, 4, 2, schedule});
  }
  return shapes;
}

bool FullMatrix() { return std::getenv("GRADHUB_PIPELINE_FULL_MATRIX") != nullptr; }

TEST_F(PipelineE2eTest, MlpStagesTimesReplicasEqualOneProcessOnTheGlobalBatch) {
  std::vector<Shape> shapes = {{kMlp, 2, 2, "GPIPE"},
                               {kMlp, 4, 1, "ONE_F_ONE_B"},
                               {kMlp, 2, 1, "INTERLEAVED_ONE_F_ONE_B"},
                               {kMlp, 2, 1, "ONE_F_ONE_B", ", balance: MEASURED_TIME"}};
  if (FullMatrix()) {
    for (const Shape& shape : Matrix(kMlp)) shapes.push_back(shape);
  }
  for (const Shape& shape : shapes) ExpectEqualsOneProcess(shape);
  // Rank 0 logs the loss it gets from the last stage.
  std::smatch loss;
  ASSERT_TRUE(std::regex_search(
      last_out_, loss, std::regex(R"("event":"progress","step":50,[^}]*"loss":([0-9.e-]+))")))
      << last_out_;
  EXPECT_GT(std::stod(loss[1]), 0.0);
}

TEST_F(PipelineE2eTest, TransformerStagesTimesReplicasEqualOneProcessOnTheGlobalBatch) {
  std::vector<Shape> shapes = {{kTransformer, 4, 1, "GPIPE"},
                               {kTransformer, 2, 2, "ONE_F_ONE_B", "", "gradClipNorm: 0.2\n"}};
  if (FullMatrix()) {
    for (const Shape& shape : Matrix(kTransformer)) shapes.push_back(shape);
  }
  for (const Shape& shape : shapes) ExpectEqualsOneProcess(shape);
}

// "stage 1/2: layers 0-1 of 3, ..." as a rank logged it.
std::string StageLine(const std::string& err) {
  std::smatch match;
  if (!std::regex_search(err, match, std::regex("stage [0-9]+/[0-9]+: layers [^\n]*"))) return "";
  return match[0].str();
}

std::vector<RunResult> PipelineE2eTest::KillAndResume(const Shape& shape,
                                                      std::vector<std::string>* killed_err) {
  const int world = shape.stages * shape.replicas;
  const std::string name = "resume-" + std::to_string(++runs_);
  const std::string dir = dir_.path() + "/" + name;
  const std::string spec =
      PipelineSpec(name + ".yaml", shape, "maxSteps: 400\ncheckpoint: {everySteps: 100}\n");
  const auto uninterrupted = Run(spec, world, dir + "-uninterrupted");
  if (HasFailure()) return {};
  const std::string checkpoints = dir + "-ckpt";
  const std::vector<std::string> extra = {"--checkpoint-dir", checkpoints};
  {
    auto ranks = StartJob(spec, world, dir_.path(), extra);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(2);
    while (NewestCheckpointStep(checkpoints) < 200 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    EXPECT_TRUE(ranks[0]->running()) << "finished before it could be killed: test is void";
    for (auto& rank : ranks) rank->Kill(SIGKILL);
    for (auto& rank : ranks) rank->Wait();
    for (auto& rank : ranks) killed_err->push_back(rank->err());
    std::filesystem::remove_all(dir_.path() + "/rdzv");
  }
  const auto resumed = Run(spec, world, dir + "-resumed", extra);
  if (HasFailure()) return {};
  std::smatch match;
  EXPECT_TRUE(std::regex_search(resumed[0].err, match, std::regex("resumed from step ([0-9]+)")))
      << resumed[0].err;
  if (HasFailure()) return {};
  EXPECT_GE(std::stoll(match[1]), 200);
  EXPECT_LT(std::stoll(match[1]), 400);
  for (int rank = 0; rank < world; ++rank) {
    EXPECT_NE(resumed[rank].err.find("resumed from step " + match[1].str()), std::string::npos)
        << "rank " << rank << " gets its stage's state from rank 0\n"
        << resumed[rank].err;
    // A rank's hash covers its stage's layers: comparable where both runs split alike (a
    // measured-time split may not); the whole model's parameters are compared below.
    if (StageLine(resumed[rank].err) == StageLine(uninterrupted[rank].err)) {
      EXPECT_EQ(DoneField(resumed[rank].out, "parametersSha256"),
                DoneField(uninterrupted[rank].out, "parametersSha256"))
          << "rank " << rank;
    }
  }
  EXPECT_EQ(MaxDifference(ReadRanks(dir + "-resumed", 0, shape.stages),
                          ReadRanks(dir + "-uninterrupted", 0, shape.stages)),
            0)
      << "the resumed run ends where the uninterrupted one does, bit for bit";
  return resumed;
}

TEST_F(PipelineE2eTest, KilledPipelineResumesBitForBit) {
  std::vector<std::string> killed_err;
  KillAndResume(Shape{kMlp, 2, 2, "ONE_F_ONE_B"}, &killed_err);
}

// Split by measured times, a restart does not measure again (its times would differ, a layer
// could move to another stage, and the stages' saved states would not fit): rank 0 splits by
// the times its checkpoint recorded, and every rank gets the killed run's layers back.
TEST_F(PipelineE2eTest, AMeasuredTimeSplitResumesWithTheSplitItsCheckpointRecorded) {
  std::vector<std::string> killed_err;
  const auto resumed =
      KillAndResume(Shape{kMlp, 2, 1, "ONE_F_ONE_B", ", balance: MEASURED_TIME"}, &killed_err);
  ASSERT_EQ(resumed.size(), 2u);
  EXPECT_NE(resumed[0].err.find("splits by the layer times its checkpoint recorded"),
            std::string::npos)
      << resumed[0].err;
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_FALSE(StageLine(killed_err[rank]).empty()) << killed_err[rank];
    EXPECT_EQ(StageLine(resumed[rank].err), StageLine(killed_err[rank])) << "rank " << rank;
  }
}

// The checkpoint's spec includes parallelism: resuming with another split is refused on every
// rank as a user error naming the field.
TEST_F(PipelineE2eTest, ResumeRefusesAnotherSplit) {
  const std::string checkpoints = dir_.path() + "/ckpt";
  const std::vector<std::string> extra = {"--checkpoint-dir", checkpoints};
  Shape shape{kMlp, 2, 1, "ONE_F_ONE_B"};
  Run(PipelineSpec("first.yaml", shape, "maxSteps: 20\n"), 2, dir_.path() + "/first", extra);
  ASSERT_FALSE(HasFailure());
  shape.micro_batches = 2;
  const std::string changed = PipelineSpec("changed.yaml", shape, "maxSteps: 40\n");
  const auto refused = RunJob(changed, 2, dir_.path(), extra);
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(refused[rank].exit_code, 10) << refused[rank].err;
    EXPECT_NE(refused[rank].err.find("spec: changed since the checkpoint"), std::string::npos)
        << refused[rank].err;
    EXPECT_NE(refused[rank].err.find("parallelism.micro_batches"), std::string::npos)
        << refused[rank].err;
  }
}

// A middle stage's rank killed with SIGKILL: every other rank exits with the infrastructure
// code (12) within the collective timeout, none hangs.
TEST_F(PipelineE2eTest, AKilledMiddleStageFailsEveryRankWithoutAHang) {
  const Shape shape{kMlp, 4, 1, "ONE_F_ONE_B"};
  const std::string spec = PipelineSpec("long.yaml", shape, "maxSteps: 1000000\n");
  auto ranks = StartJob(spec, 4, dir_.path(), {"--collective-timeout", "20s"});
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(2);
  while (ranks[0]->out().find("\"step\":100,") == std::string::npos &&
         std::chrono::steady_clock::now() < deadline && ranks[0]->running()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_TRUE(ranks[0]->running()) << ranks[0]->err();
  ranks[2]->Kill(SIGKILL);
  const auto killed = std::chrono::steady_clock::now();
  EXPECT_EQ(ranks[2]->Wait(), 128 + SIGKILL);
  for (int rank : {0, 1, 3}) {
    EXPECT_EQ(ranks[rank]->Wait(std::chrono::seconds(40)), 12) << "rank " << rank << "\n"
                                                               << ranks[rank]->err();
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count();
  EXPECT_LT(seconds, 25) << "the collective timeout is 20 s";
  std::printf("the other stages exited %.1f s after the middle stage was killed\n", seconds);
}

}  // namespace
}  // namespace gradhub
