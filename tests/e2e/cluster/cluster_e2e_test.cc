// The whole local cluster as real processes: PostgreSQL, gradhub-api (scheduler inside),
// gradhub-checkpoint, two gradhub-agents with two CPU slots each and their own checkpoint
// caches, and the trainers they start, doing real Gloo allreduce and rendezvous through the
// api's StoreService.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <thread>

#include "gradhub/v1/jobs.grpc.pb.h"
#include "gradhub/v1/nodes.grpc.pb.h"
#include "services/common/contract/job_spec.h"
#include "tests/support/local_cluster.h"

namespace gradhub {
namespace {

using std::chrono::seconds;
using testing::Ended;
using Clock = std::chrono::steady_clock;

class ClusterE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::LocalClusterOptions options;
    options.checkpoint_service = true;
    cluster_ = std::make_unique<testing::LocalCluster>(options);
    ASSERT_TRUE(cluster_->Start());
  }

  v1::Job Submit(int64_t max_steps, int hang_timeout_seconds = 60) {
    return cluster_->Submit(ParseJobSpec(
        "model: {mlp: {layers: [32, 64, 4]}}\n"
        "dataset: {synthetic: {numSamples: 4096, numFeatures: 32, numClasses: 4, noise: 0.5},"
        " validationFraction: 0.1}\n"
        "optimizer: {sgd: {lr: 0.05, momentum: 0.9}}\n"
        "batchSizePerRank: 16\n"
        "maxSteps: " +
        std::to_string(max_steps) +
        "\n"
        "logEverySteps: 10\n"
        "checkpoint: {everySteps: 25}\n"
        "distributed: {worldSize: 4, ranksPerNode: 2}\n"
        "maxRestarts: {infrastructure: 2, job: 2}\n"
        "hangTimeoutSeconds: " +
        std::to_string(hang_timeout_seconds) + "\n"));
  }

  bool HasEvent(const std::string& name, v1::JobEvent::Type type, const std::string& node) {
    for (const auto& e : cluster_->Events(name)) {
      if (e.type() == type && (node.empty() || e.node() == node)) return true;
    }
    return false;
  }

  v1::Job AwaitJob(const std::string& name, const std::function<bool(const v1::Job&)>& done,
                   seconds limit = seconds(120)) {
    return cluster_->AwaitJob(name, done, limit);
  }
  std::string Describe(const std::string& name) { return cluster_->Describe(name); }
  std::vector<v1::JobEvent> Events(const std::string& name) { return cluster_->Events(name); }

  std::unique_ptr<testing::LocalCluster> cluster_;
};

TEST_F(ClusterE2eTest, WorldFourJobSpansBothNodesSucceedsAndKeepsLogsPerRank) {
  // Agent b paused until agent a's ranks run, so that b chooses the job's uid with them
  // running as it (job_uids.h, rule 2: it must pick the same one). Paused well within the
  // lease (3 s); a's ranks wait for b's at the rendezvous meanwhile.
  const pid_t b = cluster_->AgentPid("b");
  ASSERT_EQ(kill(b, SIGSTOP), 0);
  const std::string name = Submit(200).name();
  const auto paused = Clock::now();
  while (cluster_->TrainersOf("a").size() < 2 && Clock::now() - paused < seconds(2)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_EQ(kill(b, SIGCONT), 0);
  ASSERT_EQ(cluster_->TrainersOf("a").size(), 2u) << Describe(name);
  const v1::Job job = AwaitJob(name, Ended);
  ASSERT_EQ(job.state(), v1::Job::SUCCEEDED) << job.state_reason() << "\n" << Describe(job.name());
  EXPECT_EQ(job.attempt(), 1);
  bool both = false;
  for (const auto& e : Events(job.name())) {
    both |= e.message().find("nodes/a") != std::string::npos &&
            e.message().find("nodes/b") != std::string::npos;
  }
  EXPECT_TRUE(both) << Describe(job.name());
  // Both agents ran the job's ranks as one uid (job_uids.h, rule 2), so the four ranks on this
  // one machine shared memory: no rank fell back to TCP, whose sums come in another order.
  std::set<std::string> uids;
  static const std::regex kStarted("started " + job.name() +
                                   " attempt 1 rank [0-9] as pid "
                                   "[0-9]+ (uid [0-9]+)");
  for (const std::string agent : {"a", "b"}) {
    const std::string log = cluster_->AgentStderr(agent);
    for (std::sregex_iterator it(log.begin(), log.end(), kStarted), end; it != end; ++it) {
      uids.insert((*it)[1].str());
    }
  }
  EXPECT_EQ(uids.size(), 1u) << cluster_->AgentStderr("a") << cluster_->AgentStderr("b");
  for (int rank = 0; rank < 4; ++rank) {
    for (const std::string& line : cluster_->Logs(job.name(), 1, rank)) {
      EXPECT_EQ(line.find("shared-memory allreduce unavailable"), std::string::npos) << line;
    }
  }

  // Logs outlive the processes: every rank's "done" line is in the api. Agents flush after
  // the exit, so allow them a moment.
  std::set<int> done_ranks;
  const auto deadline = Clock::now() + seconds(10);
  while (done_ranks.size() < 4 && Clock::now() < deadline) {
    v1::GetJobLogsRequest request;
    request.set_name(job.name());
    auto context = cluster_->TenantContext();
    auto reader = cluster_->jobs().GetJobLogs(context.get(), request);
    v1::LogEntry line;
    while (reader->Read(&line)) {
      if (line.text().find("\"event\":\"done\"") != std::string::npos)
        done_ranks.insert(line.rank());
    }
    EXPECT_TRUE(reader->Finish().ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  EXPECT_EQ(done_ranks, (std::set<int>{0, 1, 2, 3}));
  // The progress of a finished job is its last step, of a known total.
  const v1::Job final = AwaitJob(
      job.name(), [](const v1::Job& j) { return j.progress().step() == 200; }, seconds(10));
  EXPECT_EQ(final.progress().step(), 200);
  EXPECT_EQ(final.progress().total_steps(), 200);
}

TEST_F(ClusterE2eTest, KilledTrainerRestartsTheAttemptWhichResumesFromACheckpoint) {
  const std::string name = Submit(100000).name();
  v1::Job running = AwaitJob(name, [](const v1::Job& j) {
    return Ended(j) || (j.state() == v1::Job::RUNNING && j.progress().step() >= 60);
  });
  ASSERT_EQ(running.state(), v1::Job::RUNNING) << running.state_reason();
  std::vector<pid_t> on_b = cluster_->TrainersOf("b");
  ASSERT_EQ(on_b.size(), 2u);
  ASSERT_EQ(kill(on_b[1], SIGKILL), 0);

  const v1::Job second = AwaitJob(name, [](const v1::Job& j) {
    return Ended(j) || (j.attempt() == 2 && j.state() == v1::Job::RUNNING);
  });
  ASSERT_EQ(second.attempt(), 2) << second.state_reason() << "\n" << Describe(name);
  EXPECT_EQ(second.job_restarts(), 1);
  bool named = false;
  for (const auto& e : Events(name)) {
    if (e.type() == v1::JobEvent::RANK_FAILED) {
      named = true;
      EXPECT_EQ(e.signal(), SIGKILL) << e.DebugString();
      EXPECT_EQ(e.node(), "nodes/b");
    }
  }
  EXPECT_TRUE(named) << Describe(name);
  // Every trainer of the first attempt on b is gone; b runs only attempt 2's two ranks.
  const std::vector<pid_t> now_on_b = cluster_->TrainersOf("b");
  EXPECT_EQ(now_on_b.size(), 2u);
  for (pid_t pid : on_b) {
    EXPECT_EQ(std::count(now_on_b.begin(), now_on_b.end(), pid), 0) << "attempt 1 rank " << pid;
  }

  // The new attempt resumed: its rank 0 says from which step.
  std::string resumed;
  const auto deadline = Clock::now() + seconds(30);
  while (resumed.empty() && Clock::now() < deadline) {
    v1::GetJobLogsRequest request;
    request.set_name(name);
    request.set_attempt(2);
    request.set_rank(0);
    auto context = cluster_->TenantContext();
    auto reader = cluster_->jobs().GetJobLogs(context.get(), request);
    v1::LogEntry line;
    std::smatch match;
    static const std::regex kResumed("resumed from step ([0-9]+)");
    while (reader->Read(&line)) {
      if (std::regex_search(line.text(), match, kResumed)) resumed = match[1].str();
    }
    reader->Finish();
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  ASSERT_FALSE(resumed.empty()) << "attempt 2 did not resume from a checkpoint";
  EXPECT_GE(std::stoi(resumed), 25);

  // Cancel stops every rank, wherever it runs.
  {
    v1::CancelJobRequest request;
    request.set_name(name);
    v1::Job cancelled;
    auto context = cluster_->TenantContext();
    ASSERT_TRUE(cluster_->jobs().CancelJob(context.get(), request, &cancelled).ok());
  }
  const auto gone_by = Clock::now() + seconds(10);
  while ((!cluster_->TrainersOf("a").empty() || !cluster_->TrainersOf("b").empty()) &&
         Clock::now() < gone_by) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(cluster_->TrainersOf("a").empty());
  EXPECT_TRUE(cluster_->TrainersOf("b").empty());
}

TEST_F(ClusterE2eTest, KilledAgentLosesItsNodeAndTheJobRunsAgainWhenItReturns) {
  const std::string name = Submit(100000).name();
  ASSERT_EQ(AwaitJob(name,
                     [](const v1::Job& j) {
                       return Ended(j) ||
                              (j.state() == v1::Job::RUNNING && j.progress().step() >= 20);
                     })
                .state(),
            v1::Job::RUNNING);
  const std::vector<pid_t> trainers = cluster_->TrainersOf("b");
  ASSERT_EQ(trainers.size(), 2u);
  cluster_->KillAgent("b", SIGKILL);
  const auto killed = Clock::now();

  // Its trainers die with it (PR_SET_PDEATHSIG) and the node is lost within the lease (3 s).
  while (cluster_->NodeState("b") != v1::Node::LOST && Clock::now() - killed < seconds(10)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(cluster_->NodeState("b"), v1::Node::LOST);
  EXPECT_LT(Clock::now() - killed, seconds(6));
  for (pid_t pid : trainers)
    EXPECT_NE(kill(pid, 0), 0) << "trainer " << pid << " outlived its agent";
  // World size 4 does not fit on node a alone: the job waits and says why.
  const v1::Job waiting = AwaitJob(
      name,
      [](const v1::Job& j) {
        return j.state() == v1::Job::RESTARTING &&
               j.state_reason().find("needs 4 slots") != std::string::npos;
      },
      seconds(20));
  EXPECT_EQ(waiting.state(), v1::Job::RESTARTING) << waiting.state_reason() << Describe(name);
  EXPECT_EQ(waiting.infrastructure_restarts(), 1);

  ASSERT_TRUE(cluster_->StartAgent("b"));
  const v1::Job again = AwaitJob(name, [](const v1::Job& j) {
    return Ended(j) || (j.attempt() == 2 && j.state() == v1::Job::RUNNING);
  });
  EXPECT_EQ(again.state(), v1::Job::RUNNING) << again.state_reason() << Describe(name);
  EXPECT_EQ(cluster_->NodeState("b"), v1::Node::READY);
  cluster_->Cancel(name);
}

TEST_F(ClusterE2eTest, StoppedRankIsCaughtByTheWatchdogAndTheJobRestarts) {
  const std::string name = Submit(100000, /*hang_timeout_seconds=*/5).name();
  ASSERT_EQ(AwaitJob(name,
                     [](const v1::Job& j) {
                       return Ended(j) ||
                              (j.state() == v1::Job::RUNNING && j.progress().step() >= 20);
                     })
                .state(),
            v1::Job::RUNNING);
  const std::vector<pid_t> on_b = cluster_->TrainersOf("b");
  ASSERT_EQ(on_b.size(), 2u);
  ASSERT_EQ(kill(on_b[0], SIGSTOP), 0);
  const auto stopped = Clock::now();
  const v1::Job restarted = AwaitJob(
      name, [](const v1::Job& j) { return Ended(j) || j.attempt() == 2; }, seconds(60));
  EXPECT_EQ(restarted.attempt(), 2) << restarted.state_reason() << Describe(name);
  EXPECT_LT(Clock::now() - stopped, seconds(5 + 5));
  EXPECT_TRUE(HasEvent(name, v1::JobEvent::HANG_DETECTED, "")) << Describe(name);
  cluster_->Cancel(name);
}

}  // namespace
}  // namespace gradhub
