// A pipelined job (4 stages, 1F1B) through the whole platform: real PostgreSQL, api and
// scheduler, gradhub-checkpoint, two agents of two slots with separate work directories, real
// trainers. One middle stage's process is SIGKILLed after a checkpoint is committed; the
// other stages must not hang, the api must restart the job, and the next attempt must resume
// from the store and end bit for bit where an uninterrupted run of the same spec ends.
// (tests/e2e/trainer/pipeline_e2e_test.cc covers the same at the trainer level, without the
// platform.)
#include <dirent.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <thread>

#include "services/common/contract/job_spec.h"
#include "tests/e2e/checkpoint/checkpoint_checks.h"
#include "tests/support/local_cluster.h"

namespace gradhub {
namespace {

using std::chrono::seconds;
using testing::FinalLoss;
using testing::LocalCluster;
using Clock = std::chrono::steady_clock;

constexpr int kStages = 4;
constexpr int kKilledRank = 1;  // a middle stage: it has a neighbour on either side
constexpr int64_t kSteps = 1000;
constexpr int64_t kCheckpointEvery = 100;
// How long the other stages may take to leave once their neighbour is dead: the trainer's
// collective timeout is 60 s, and the api stops the attempt's ranks sooner than that.
constexpr seconds kNoHangBound(60);

// World 4 = 4 stages x 1 replica, two ranks per node: the killed stage has a neighbour on its
// own node and one on the other. An MLP of 4 layers (one per stage), 4 micro-batches of 4
// samples; SGD with momentum, so that an exact resume needs each stage's optimizer state too.
// Noisy data (the loss stays near 0.3 to the end): with little noise the loss reaches 0 within
// 50 steps, the gradients vanish, and a resume that lost state would still end bit for bit.
v1::JobSpec Spec() {
  return ParseJobSpec(
      "model: {mlp: {layers: [32, 64, 64, 64, 4]}}\n"
      "dataset: {synthetic: {numSamples: 4096, numFeatures: 32, numClasses: 4, noise: 5},"
      " validationFraction: 0.1}\n"
      "optimizer: {sgd: {lr: 0.01, momentum: 0.9}}\n"
      "batchSizePerRank: 16\n"
      "parallelism: {pipelineStages: 4, microBatches: 4, schedule: ONE_F_ONE_B}\n"
      "maxSteps: " +
      std::to_string(kSteps) +
      "\n"
      "logEverySteps: 20\n"
      "checkpoint: {everySteps: " +
      std::to_string(kCheckpointEvery) +
      ", keepLast: 2}\n"
      "distributed: {worldSize: 4, ranksPerNode: 2}\n"
      "maxRestarts: {infrastructure: 2, job: 2}\n");
}

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Each rank's parametersSha256 (its stage's parameters) from the "done" lines of the job's
// last attempt; "" for a rank that has none.
std::vector<std::string> FinalStageParameters(LocalCluster& cluster, const std::string& name) {
  static const std::regex kDone("\"parametersSha256\":\"([0-9a-f]{64})\"");
  std::vector<std::string> found(kStages);
  const auto deadline = Clock::now() + seconds(15);  // agents ship logs after the exit
  for (int rank = 0; rank < kStages && Clock::now() < deadline; ++rank) {
    while (found[rank].empty() && Clock::now() < deadline) {
      for (const std::string& line : cluster.Logs(name, 0, rank)) {
        std::smatch match;
        if (std::regex_search(line, match, kDone)) found[rank] = match[1].str();
      }
      if (found[rank].empty()) std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  }
  return found;
}

// A process's environment as the agent set it at exec ({} for a zombie or a process gone).
std::map<std::string, std::string> EnvironmentOf(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/environ", std::ios::binary);
  std::map<std::string, std::string> environment;
  std::string entry;
  while (std::getline(in, entry, '\0')) {
    const size_t equals = entry.find('=');
    if (equals != std::string::npos)
      environment[entry.substr(0, equals)] = entry.substr(equals + 1);
  }
  return environment;
}

bool IsTrainer(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/comm");
  std::string comm;
  std::getline(in, comm);
  return comm.rfind("gradhub-traine", 0) == 0;  // the kernel keeps 15 characters
}

// The live gradhub-trainer processes of one attempt of job `job_id`, by global rank, found
// by the environment their agent gave them (gpu_worker/agent/rank_launch.cc): whichever
// agent runs them.
std::map<int, pid_t> RankProcesses(const std::string& job_id, int attempt) {
  std::map<int, pid_t> ranks;
  DIR* proc = opendir("/proc");
  while (dirent* entry = readdir(proc)) {
    const pid_t pid = atoi(entry->d_name);
    if (pid <= 0 || !IsTrainer(pid)) continue;
    const auto environment = EnvironmentOf(pid);
    const auto value = [&](const char* key) {
      const auto found = environment.find(key);
      return found == environment.end() ? std::string() : found->second;
    };
    if (value("GRADHUB_JOB_ID") == job_id && value("GRADHUB_ATTEMPT") == std::to_string(attempt)) {
      ranks[std::stoi(value("GRADHUB_RANK"))] = pid;
    }
  }
  closedir(proc);
  return ranks;
}

// The step each rank of `attempt` says it resumed from, by rank ("" = it did not say).
std::vector<std::string> ResumedSteps(LocalCluster& cluster, const std::string& name, int attempt) {
  static const std::regex kResumed("resumed from step ([0-9]+)");
  std::vector<std::string> steps(kStages);
  for (int rank = 0; rank < kStages; ++rank) {
    for (const std::string& line : cluster.Logs(name, attempt, rank)) {
      std::smatch match;
      if (std::regex_search(line, match, kResumed)) steps[rank] = match[1].str();
    }
  }
  return steps;
}

class PipelineRestartE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::LocalClusterOptions options;
    options.checkpoint_service = true;  // agents = {a, b}, 2 slots each
    cluster_ = std::make_unique<LocalCluster>(options);
    ASSERT_TRUE(cluster_->Start());
  }

  // Waits until attempt 1 runs and the store holds a committed checkpoint of it; returns
  // the newest committed step (0 if the job ended or the wait timed out first).
  int64_t AwaitFirstCheckpoint(const std::string& name) {
    int64_t newest = 0;
    cluster_->AwaitJob(name, [&](const v1::Job& j) {
      if (testing::Ended(j) || j.attempt() != 1 || j.state() != v1::Job::RUNNING) {
        return testing::Ended(j);
      }
      newest = testing::NewestCommittedStep(*cluster_, name);
      return newest > 0;
    });
    return newest;
  }

  // Attempt 1 saves nothing more once a stage is dead (its pipeline stalls), and attempt 2
  // starts only once attempt 1's ranks are gone: emptying every agent's checkpoint cache in
  // between makes attempt 2 download its checkpoint from gradhub-checkpoint.
  void ForgetCachedCheckpoints(const std::string& job_id) {
    for (const std::string agent : {"a", "b"}) {
      std::error_code ignored;  // an agent that never cached one has no directory
      std::filesystem::remove_all(
          std::filesystem::path(cluster_->dir()) / ("agent-" + agent) / "checkpoints" / job_id,
          ignored);
    }
  }

  // Polls until none of `pids` is a live process of its rank any more; false after `limit`.
  static bool AwaitGone(const std::vector<pid_t>& pids, seconds limit) {
    const auto deadline = Clock::now() + limit;
    while (Clock::now() < deadline) {
      bool live = false;
      for (pid_t pid : pids) live |= EnvironmentOf(pid).count("GRADHUB_JOB_ID") > 0;
      if (!live) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }

  // The uninterrupted run's parameters, stage by stage.
  std::vector<std::string> Reference() {
    const auto start = Clock::now();
    const v1::Job job =
        cluster_->AwaitJob(cluster_->Submit(Spec()).name(), testing::Ended, seconds(300));
    EXPECT_EQ(job.state(), v1::Job::SUCCEEDED)
        << job.state_reason() << cluster_->Describe(job.name());
    EXPECT_EQ(job.attempt(), 1);
    std::printf("uninterrupted run: %.1f s for %lld steps\n", SecondsSince(start),
                static_cast<long long>(kSteps));
    std::vector<std::string> parameters = FinalStageParameters(*cluster_, job.name());
    EXPECT_GT(FinalLoss(*cluster_, job.name()), 0.01) << "still training at the end: see Spec()";
    return parameters;
  }

  struct Kill {
    int64_t committed = 0;  // the newest committed checkpoint's step before the kill
    int64_t near_step = 0;  // the step the job reported last before the kill
    Clock::time_point time;
  };

  // 1. Attempt 1 runs past its first committed checkpoint, to a step between two of them (so
  //    that attempt 2 trains some steps again).
  // 2. Rank kKilledRank is SIGKILLed; its neighbours are left waiting on it in a send or a
  //    receive. Every agent's checkpoint cache of the job is emptied.
  // 3. Every other rank of attempt 1 is gone within kNoHangBound.
  void KillMiddleStageAfterACheckpoint(const std::string& name, Kill* kill_at) {
    const std::string job_id = name.substr(sizeof("jobs/") - 1);
    kill_at->committed = AwaitFirstCheckpoint(name);
    ASSERT_GT(kill_at->committed, 0) << "no checkpoint committed\n" << cluster_->Describe(name);
    const v1::Job running = cluster_->AwaitJob(name, [&](const v1::Job& j) {
      return testing::Ended(j) || j.progress().step() > kill_at->committed + kCheckpointEvery / 3;
    });
    ASSERT_EQ(running.state(), v1::Job::RUNNING)
        << running.state_reason() << cluster_->Describe(name);
    ASSERT_EQ(running.attempt(), 1) << cluster_->Describe(name);
    const std::map<int, pid_t> ranks = RankProcesses(job_id, 1);
    ASSERT_EQ(ranks.size(), static_cast<size_t>(kStages)) << cluster_->Describe(name);
    kill_at->near_step = cluster_->Get(name).progress().step();

    ASSERT_EQ(kill(ranks.at(kKilledRank), SIGKILL), 0);  // step 2
    kill_at->time = Clock::now();
    ForgetCachedCheckpoints(job_id);

    std::vector<pid_t> others;  // step 3
    for (const auto& [rank, pid] : ranks) {
      if (rank != kKilledRank) others.push_back(pid);
    }
    const bool gone = AwaitGone(others, kNoHangBound);
    std::printf(
        "rank %d SIGKILLed near step %lld: the other ranks of attempt 1 gone %.2f s later\n",
        kKilledRank, static_cast<long long>(kill_at->near_step), SecondsSince(kill_at->time));
    ASSERT_TRUE(gone) << "a rank of attempt 1 still runs " << kNoHangBound.count()
                      << " s after rank " << kKilledRank << " was killed\n"
                      << cluster_->Describe(name);
  }

  // The killed rank is the one blamed: a JOB failure, by SIGKILL, not a peer's exit 12.
  void ExpectTheKilledRankBlamed(const std::string& name) {
    bool blamed = false;
    for (const auto& e : cluster_->Events(name)) {
      blamed |= e.type() == v1::JobEvent::RANK_FAILED && e.attempt() == 1 &&
                e.rank() == kKilledRank && e.signal() == SIGKILL &&
                e.failure_kind() == v1::JobEvent::JOB;
      if (e.type() == v1::JobEvent::STATE_CHANGED && e.to_state() == v1::Job::SCHEDULED) {
        std::printf("%s\n", e.message().c_str());  // where each attempt's stages ran
      }
    }
    EXPECT_TRUE(blamed) << cluster_->Describe(name);
  }

  // Every stage of attempt 2 resumed from one step (> 0) that attempt 1 committed, downloaded
  // from gradhub-checkpoint.
  void ExpectResumedFromTheStore(const std::string& name, const Kill& kill_at) {
    const std::vector<std::string> resumed = ResumedSteps(*cluster_, name, 2);
    ASSERT_FALSE(resumed[0].empty()) << "attempt 2 did not resume from the store";
    const int64_t step = std::stoll(resumed[0]);
    std::printf("attempt 2 resumed from step %lld\n", static_cast<long long>(step));
    EXPECT_GT(step, 0);
    EXPECT_EQ(step % kCheckpointEvery, 0);
    EXPECT_GE(step, kill_at.committed) << "an older checkpoint than the one committed";
    EXPECT_LE(step, kill_at.near_step + kCheckpointEvery) << "a step attempt 1 never saved";
    for (int rank = 1; rank < kStages; ++rank) {
      EXPECT_EQ(resumed[rank], resumed[0]) << "rank " << rank << " resumed elsewhere";
    }
    for (const std::string& line : cluster_->Logs(name, 2, 0)) {
      EXPECT_EQ(line.find("read from the local cache"), std::string::npos)
          << "the checkpoint came from a cache, not from the store: " << line;
    }
  }

  std::unique_ptr<LocalCluster> cluster_;
};

// Global rank 1 (stage 2 of 4) SIGKILLed between checkpoints: ranks 0, 2 and 3 of that attempt
// leave within the bound, the api blames the killed rank (a JOB failure) and places attempt 2,
// whose every stage resumes from the same committed step (> 0) from the store, and the job
// ends with the uninterrupted run's parameters on every stage, bit for bit.
TEST_F(PipelineRestartE2eTest, KilledMiddleStageRestartsAndResumesExactlyFromTheStore) {
  const std::vector<std::string> reference = Reference();
  for (int rank = 0; rank < kStages; ++rank) ASSERT_EQ(reference[rank].size(), 64u) << rank;

  const std::string name = cluster_->Submit(Spec()).name();
  Kill kill_at;
  ASSERT_NO_FATAL_FAILURE(KillMiddleStageAfterACheckpoint(name, &kill_at));
  const v1::Job restarted = cluster_->AwaitJob(name, [](const v1::Job& j) {
    return testing::Ended(j) || (j.attempt() == 2 && j.state() == v1::Job::RUNNING);
  });
  std::printf("attempt 2 running %.2f s after the kill\n", SecondsSince(kill_at.time));
  ASSERT_EQ(restarted.attempt(), 2) << restarted.state_reason() << cluster_->Describe(name);
  const v1::Job done = cluster_->AwaitJob(name, testing::Ended, seconds(300));
  ASSERT_EQ(done.state(), v1::Job::SUCCEEDED) << done.state_reason() << cluster_->Describe(name);
  EXPECT_EQ(done.attempt(), 2) << "one restart for one kill\n" << cluster_->Describe(name);

  ExpectTheKilledRankBlamed(name);
  ExpectResumedFromTheStore(name, kill_at);
  const std::vector<std::string> parameters = FinalStageParameters(*cluster_, name);
  for (int rank = 0; rank < kStages; ++rank) {
    EXPECT_EQ(parameters[rank], reference[rank]) << "stage " << rank + 1;
  }
}

}  // namespace
}  // namespace gradhub
