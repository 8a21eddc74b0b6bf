// The point of pipeline stages (issue 33's acceptance), through the real platform: a model whose
// parameters and Adam state exceed the agents' --memory-per-slot fails with the out-of-memory
// reason at S=1, and trains to the end at S=2, where each stage holds about half of it.
//
// One agent with two slots of kLimit bytes each; the same MLP with Adam in both tests. The
// memory mechanism is whatever the agent picks (memory_limit.h): a memory cgroup per rank as
// root (v1 or v2; the kernel OOM-kills the rank at the limit), else RLIMIT_DATA (an allocation
// fails and the trainer exits 14). Both name "out of memory: limit N bytes", but the sizes
// below are the cgroup's: RLIMIT_DATA counts every writable private mapping (thread stacks,
// malloc arenas), some 430 MB more per rank here (VmData peaked at 658 and 640 MB at S = 2, 769
// MB at S = 1), so without root the tests skip.
//
// An agent always gives its ranks a store, so a run always saves at its last step
// (checkpoint.everySteps 0 = only at the end), and the S = 2 run must fit its checkpoint in the
// same slots: each stage's state goes to the store through files (checkpoint_bytes.h,
// checkpointer.h), never as a copy in a rank's memory. The file pages are page cache, charged to
// the rank's cgroup but reclaimed at its limit; so the cgroup's peak may reach the limit
// without harm, and the sampler also records the rank's anonymous memory (rss), what the
// limit really bounds.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/e2e/checkpoint/checkpoint_checks.h"
#include "tests/support/local_cluster.h"

namespace gradhub {
namespace {

using ::testing::HasSubstr;

// Two large W x W layers, so that PARAMETERS balance cuts the model into two halves of one
// large layer each: stage 1 = Linear(16, W) + Linear(W, W), stage 2 = Linear(W, W) +
// Linear(W, 2). A W x W tensor (37.7 MB) is above glibc's largest mmap threshold (32 MiB), so
// each is its own mapping, returned to the kernel when freed: with W = 2896 (33.5 MB, just
// under it) freed tensors stayed in the heap, and the ranks peaked 35% higher than below.
constexpr int kWidth = 3072;
const std::vector<int> kLayers = {16, kWidth, kWidth, kWidth, 2};

// float32 bytes of the Linear layers [first, last) of kLayers (weight in x out, bias out).
int64_t ParameterBytes(size_t first, size_t last) {
  int64_t count = 0;
  for (size_t i = first; i < last; ++i) {
    count += int64_t{kLayers[i]} * kLayers[i + 1] + kLayers[i + 1];
  }
  return 4 * count;
}

// float32 bytes of the largest parameter tensor (a W x W weight, in either stage).
constexpr int64_t kLargestTensor = int64_t{4} * kWidth * kWidth;

// What a rank holds for its layers while it trains with Adam: the parameters, their gradients
// and Adam's two moments (4 x the parameter bytes), and two temporaries of the tensor Adam is
// updating (torch::optim::Adam: sqrt(exp_avg_sq), then its quotient; 2 x the largest tensor).
// Activations of a batch of 8 are small beside it. With W = 3072:
//   whole model (S = 1): 4 x 4 (16 W + W + 2 (W^2 + W) + 2 W + 2) + 2 x 4 W^2
//                        = 4 x 75.8 MB + 75.5 MB = 379 MB
//   one stage   (S = 2): 4 x 4 (16 W + W + W^2 + W) + 2 x 4 W^2 = 4 x 38.0 MB + 75.5 MB = 227 MB
// Measured (each rank in a memory cgroup of its own, v1 max_usage_in_bytes, the trainer run by
// hand without a checkpoint store, 2-core test VM): the trainer's baseline (libtorch, gloo, the
// data) is 64 MB at world 1 and 65-68 MB per rank at world 2, for this spec with layers
// [16, 32, 32, 32, 2]; this spec peaked at 445 MB at S = 1 and at 298 and 292 MB (ranks 0 and
// 1) at S = 2, the formula plus the baseline within 1%.
const int64_t kWholeModelTraining = 4 * ParameterBytes(0, kLayers.size() - 1) + 2 * kLargestTensor;
const int64_t kStageTraining = 4 * ParameterBytes(0, 2) + 2 * kLargestTensor;
constexpr int64_t kBaseline = int64_t{68} << 20;
// Halfway between the two, 374 MB: S = 1 needs some 70 MB more, S = 2 some 75 MB less. That
// margin is also what found a resumed stage holding 25-70 MB more than its first attempt: the
// gRPC window of its checkpoint download (grpc_receive_window.h). It was killed here once in
// a full parallel ctest and once in four runs beside two busy loops; bounded, 3 such runs of
// 3 peaked at 285-286 MiB.
const int64_t kLimit = kBaseline + (kWholeModelTraining + kStageTraining) / 2;

constexpr int kSteps = 12;

v1::JobSpec MlpWithAdam(const std::string& name) {
  v1::JobSpec spec;
  spec.set_display_name(name);
  for (int width : kLayers) spec.mutable_model()->mutable_mlp()->add_layers(width);
  auto* synthetic = spec.mutable_dataset()->mutable_synthetic();
  synthetic->set_num_samples(256);
  synthetic->set_num_features(kLayers.front());
  synthetic->set_num_classes(kLayers.back());
  spec.mutable_optimizer()->mutable_adam()->set_lr(1e-3);
  spec.set_batch_size_per_rank(8);
  spec.set_max_steps(kSteps);
  spec.set_log_every_steps(1);
  return spec;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

struct RankMemory {
  int64_t charged = 0;    // the most its memory cgroup was charged, page cache included
  int64_t anonymous = 0;  // the cgroup's anonymous memory now (the process's RSS without one)
};

// Process `pid`'s memory: v1 max_usage_in_bytes and memory.stat's rss, v2 memory.peak and
// memory.stat's anon; without a cgroup (RLIMIT_DATA), its private data now (VmData) and RSS.
// Zeros if unknown.
RankMemory MemoryOf(pid_t pid) {
  const std::string proc = "/proc/" + std::to_string(pid);
  const std::string cgroups = ReadFile(proc + "/cgroup");
  std::smatch match;
  std::string peak, stat, anonymous_key;
  if (std::regex_search(cgroups, match, std::regex("\\d+:[^:\\n]*memory[^:\\n]*:([^\\n]*)"))) {
    const std::string dir = "/sys/fs/cgroup/memory" + match[1].str();
    peak = ReadFile(dir + "/memory.max_usage_in_bytes");
    stat = ReadFile(dir + "/memory.stat");
    anonymous_key = "rss";
  } else if (std::regex_search(cgroups, match, std::regex("0::([^\\n]*)"))) {
    const std::string dir = "/sys/fs/cgroup" + match[1].str();
    peak = ReadFile(dir + "/memory.peak");
    stat = ReadFile(dir + "/memory.stat");
    anonymous_key = "anon";
  }
  RankMemory memory;
  if (!peak.empty()) memory.charged = std::stoll(peak);
  if (std::regex_search(stat, match, std::regex("(?:^|\\n)" + anonymous_key + " (\\d+)"))) {
    memory.anonymous = std::stoll(match[1].str());
  }
  if (memory.charged == 0) {
    const std::string status = ReadFile(proc + "/status");
    if (std::regex_search(status, match, std::regex("VmData:\\s+(\\d+)"))) {
      memory.charged = std::stoll(match[1].str()) * 1024;
    }
    if (std::regex_search(status, match, std::regex("VmRSS:\\s+(\\d+)"))) {
      memory.anonymous = std::stoll(match[1].str()) * 1024;
    }
  }
  return memory;
}

// GRADHUB_RANK of process `pid` (the agent sets it); -1 if unreadable.
int RankOf(pid_t pid) {
  const std::string environ = ReadFile("/proc/" + std::to_string(pid) + "/environ");
  std::smatch match;
  if (!std::regex_search(environ, match, std::regex("(?:^|\\x00)GRADHUB_RANK=(\\d+)"))) return -1;
  return std::stoi(match[1].str());
}

// Samples every rank's memory (MemoryOf) of one agent's trainers until destroyed, for the
// measurements this test prints: the cgroup is gone once the rank exits, so the last sample
// before then is a lower bound of the rank's peak; the anonymous memory is the most of 50 ms
// samples, also a lower bound.
class PeakSampler {
 public:
  PeakSampler(testing::LocalCluster& cluster, const std::string& agent)
      : thread_([this, &cluster, agent] {
          while (!stop_) {
            for (pid_t pid : cluster.TrainersOf(agent)) Record(RankOf(pid), MemoryOf(pid));
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
          }
        }) {}
  ~PeakSampler() { Stop(); }

  // Rank -> the most bytes seen of each.
  std::map<int, RankMemory> Stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    return peaks_;
  }

 private:
  void Record(int rank, const RankMemory& memory) {
    if (rank < 0) return;
    RankMemory& peak = peaks_[rank];
    peak.charged = std::max(peak.charged, memory.charged);
    peak.anonymous = std::max(peak.anonymous, memory.anonymous);
  }
  std::atomic<bool> stop_{false};
  std::map<int, RankMemory> peaks_;  // the sampling thread's until Stop joins it
  std::thread thread_;
};

std::string Megabytes(int64_t bytes) { return std::to_string(bytes >> 20) + " MiB"; }

std::string Peaks(const std::map<int, RankMemory>& peaks) {
  std::string text;
  for (const auto& [rank, memory] : peaks) {
    text += " rank " + std::to_string(rank) + " charged " + Megabytes(memory.charged) +
            ", anonymous " + Megabytes(memory.anonymous) + ";";
  }
  return text;
}

class PipelineMemoryE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "sized for memory cgroups, which need a root agent";
  }

  // One agent, two slots of `memory_per_slot` bytes each; false (and a test failure) when
  // something did not come up.
  bool StartCluster(const std::string& memory_per_slot) {
    testing::LocalClusterOptions options;
    options.agents = {"a"};
    options.slots = 2;
    options.memory_per_slot = memory_per_slot;
    options.checkpoint_service = true;  // the gRPC store, as deployed: downloads and uploads
    cluster_ = std::make_unique<testing::LocalCluster>(options);
    if (!cluster_->Start()) return false;
    std::cerr << "model " << Megabytes(ParameterBytes(0, kLayers.size() - 1))
              << " of parameters; training " << Megabytes(kWholeModelTraining) << " whole, "
              << Megabytes(kStageTraining) << " a stage; limit " << kLimit << " bytes ("
              << Megabytes(kLimit) << ")\n";
    return true;
  }

  // Runs `spec` to its end, sampling its ranks' memory; prints what it saw.
  v1::Job RunToEnd(const v1::JobSpec& spec, std::map<int, RankMemory>* peaks) {
    PeakSampler sampler(*cluster_, "a");
    const auto submitted = std::chrono::steady_clock::now();
    const std::string name = cluster_->Submit(spec).name();
    const v1::Job job = cluster_->AwaitJob(name, testing::Ended, std::chrono::seconds(150));
    *peaks = sampler.Stop();
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - submitted).count();
    std::cerr << spec.display_name() << ": " << v1::Job::State_Name(job.state()) << " after "
              << seconds << " s at step " << job.progress().step() << ";" << Peaks(*peaks)
              << " reason: " << job.state_reason() << "\n";
    return job;
  }

  std::unique_ptr<testing::LocalCluster> cluster_;
};

// The whole model on one rank: parameters, gradients and Adam's moments exceed the slot.
TEST_F(PipelineMemoryE2eTest, OneStageExceedsTheSlotAndFailsOutOfMemory) {
  if (!StartCluster(std::to_string(kLimit))) return;
  std::map<int, RankMemory> peaks;
  const v1::Job job = RunToEnd(MlpWithAdam("one-stage"), &peaks);
  EXPECT_EQ(job.state(), v1::Job::FAILED) << cluster_->Describe(job.name());
  EXPECT_THAT(job.state_reason(),
              HasSubstr("out of memory: limit " + std::to_string(kLimit) + " bytes"));
  EXPECT_LT(job.progress().step(), kSteps);
}

v1::JobSpec TwoStages(const std::string& name) {
  v1::JobSpec spec = MlpWithAdam(name);
  spec.mutable_distributed()->set_world_size(2);
  spec.mutable_distributed()->set_ranks_per_node(2);
  spec.mutable_parallelism()->set_pipeline_stages(2);
  spec.mutable_parallelism()->set_micro_batches(2);
  return spec;
}

// Two stages on two slots of the same size: each rank holds half the model, and trains to the
// end, its last step's checkpoint included. That save was the tight spot while rank 0 gathered
// the stages' states in memory (it peaked at about 4.5x what one stage trains in); now each
// stage's state goes through files (checkpointer.h), and the checkpoint must be the one the
// store holds for the last step.
TEST_F(PipelineMemoryE2eTest, TwoStagesFitTheSameSlotsAndTrainToTheEnd) {
  if (!StartCluster(std::to_string(kLimit))) return;
  std::map<int, RankMemory> peaks;
  const v1::Job job = RunToEnd(TwoStages("two-stages"), &peaks);
  EXPECT_EQ(job.state(), v1::Job::SUCCEEDED) << cluster_->Describe(job.name());
  EXPECT_EQ(job.progress().step(), kSteps);
  EXPECT_EQ(job.attempt(), 1) << "no rank was stopped and restarted";
  // The store holds the last step's checkpoint, with every stage's parameters and both Adam
  // moments in it.
  const std::optional<v1::Checkpoint> newest = testing::NewestCommitted(*cluster_, job.name());
  ASSERT_TRUE(newest.has_value()) << "no committed checkpoint";
  EXPECT_EQ(newest->step(), kSteps);
  EXPECT_GE(newest->size_bytes(), 3 * ParameterBytes(0, kLayers.size() - 1));
  // Each rank held the half of the model the arithmetic above assumes.
  for (int rank : {0, 1}) {
    std::string log;
    for (const std::string& line : cluster_->Logs(job.name(), 0, rank)) log += line + "\n";
    EXPECT_THAT(log,
                HasSubstr(rank == 0 ? "stage 1/2: layers 0-1 of 4" : "stage 2/2: layers 2-3 of 4"))
        << "rank " << rank;
  }
}

// A restart in the same slots, which reads a checkpoint as large as the saves write:
//   1. the two-stage job runs past its first committed checkpoint;
//   2. rank 1 is SIGKILLed, and the agent's checkpoint cache of the job emptied, so that
//      attempt 2 downloads the checkpoint from gradhub-checkpoint;
//   3. attempt 2's rank 0 streams rank 1 its stage's state, both resume from the committed
//      step and train to the end: nothing of it exceeds the slot (the cgroup would kill it).
TEST_F(PipelineMemoryE2eTest, TwoStagesResumeFromTheStoreInTheSameSlots) {
  if (!StartCluster(std::to_string(kLimit))) return;
  v1::JobSpec spec = TwoStages("two-stages-resumed");
  spec.set_max_steps(2 * kSteps);
  spec.mutable_checkpoint()->set_every_steps(4);
  spec.mutable_max_restarts()->set_job(1);
  PeakSampler sampler(*cluster_, "a");
  const std::string name = cluster_->Submit(spec).name();
  int64_t committed = 0;  // step 1
  const v1::Job running = cluster_->AwaitJob(name, [&](const v1::Job& job) {
    if (testing::Ended(job) || job.attempt() > 1) return true;
    if (job.state() != v1::Job::RUNNING) return false;  // not placed yet
    committed = testing::NewestCommittedStep(*cluster_, name);
    return committed > 0 && job.progress().step() > committed;
  });
  ASSERT_EQ(running.state(), v1::Job::RUNNING) << cluster_->Describe(name);
  ASSERT_GT(committed, 0);
  pid_t victim = 0;  // step 2
  for (pid_t pid : cluster_->TrainersOf("a")) {
    if (RankOf(pid) == 1) victim = pid;
  }
  ASSERT_GT(victim, 0) << "rank 1's process not found";
  ASSERT_EQ(kill(victim, SIGKILL), 0);
  std::error_code ignored;
  std::filesystem::remove_all(std::filesystem::path(cluster_->dir()) / "agent-a" / "checkpoints" /
                                  name.substr(sizeof("jobs/") - 1),
                              ignored);
  const v1::Job job = cluster_->AwaitJob(name, testing::Ended, std::chrono::seconds(240));
  const std::map<int, RankMemory> peaks = sampler.Stop();
  std::cerr << "resumed: " << v1::Job::State_Name(job.state()) << " at step "
            << job.progress().step() << " in attempt " << job.attempt() << ";" << Peaks(peaks)
            << "\n";
  EXPECT_EQ(job.state(), v1::Job::SUCCEEDED) << cluster_->Describe(name);  // step 3
  EXPECT_EQ(job.attempt(), 2) << cluster_->Describe(name);
  EXPECT_EQ(job.progress().step(), 2 * kSteps);
  std::vector<int64_t> resumed;  // by rank: the step attempt 2 says it resumed from
  for (int rank : {0, 1}) {
    std::string log;
    for (const std::string& line : cluster_->Logs(name, 2, rank)) log += line + "\n";
    std::smatch match;
    resumed.push_back(std::regex_search(log, match, std::regex("resumed from step ([0-9]+)"))
                          ? std::stoll(match[1].str())
                          : -1);
    EXPECT_THAT(log, ::testing::Not(HasSubstr("read from the local cache"))) << "rank " << rank;
  }
  EXPECT_GE(resumed[0], committed) << "attempt 2 did not resume from the store";
  EXPECT_EQ(resumed[1], resumed[0]);
}

// A measurement, not a check (GRADHUB_PIPELINE_MEMORY_MEASURE=1 runs it): what every rank of
// the two-stage job peaks at with a checkpoint every 4 steps, against kLimit, in slots of 4 GiB
// (a limit, so that each rank has a memory cgroup that records its peak).
TEST_F(PipelineMemoryE2eTest, TwoStagesWithCheckpointsMeasured) {
  if (std::getenv("GRADHUB_PIPELINE_MEMORY_MEASURE") == nullptr) {
    GTEST_SKIP() << "a measurement: GRADHUB_PIPELINE_MEMORY_MEASURE=1 runs it";
  }
  if (!StartCluster(std::to_string(int64_t{4} << 30))) return;
  v1::JobSpec spec = TwoStages("two-stages-checkpointed");
  spec.mutable_checkpoint()->set_every_steps(4);
  std::map<int, RankMemory> peaks;
  const v1::Job job = RunToEnd(spec, &peaks);
  EXPECT_EQ(job.state(), v1::Job::SUCCEEDED) << cluster_->Describe(job.name());
  for (const auto& [rank, memory] : peaks) {
    std::cerr << "rank " << rank << " peaked at " << Megabytes(memory.anonymous) << " anonymous, "
              << (memory.anonymous > kLimit ? "over" : "within") << " the limit of "
              << Megabytes(kLimit) << " (charged " << Megabytes(memory.charged)
              << " with page cache)\n";
  }
}

}  // namespace
}  // namespace gradhub
