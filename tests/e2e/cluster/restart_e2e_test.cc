// How the agents stop the ranks the api no longer wants (nodes.proto heartbeat step 4; issue
// 37), on the whole local cluster with a stop grace far longer than the test waits:
//   - the survivors of an attempt that failed because one of its ranks was killed are
//     SIGKILLed at once (4a): SIGSTOPped first, so that neither their own exit nor a SIGTERM
//     could end them, they are gone and the next attempt runs well within the grace;
//   - a cancelled job's ranks still get SIGTERM and the grace (4b): rank 0 stops after the step
//     it finished and says so.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "gradhub/v1/jobs.grpc.pb.h"
#include "services/common/contract/job_spec.h"
#include "tests/support/local_cluster.h"

namespace gradhub {
namespace {

using std::chrono::seconds;
using testing::Ended;
using Clock = std::chrono::steady_clock;

// Far above what the test allows for a restart: a survivor left to the grace fails it.
constexpr char kStopGrace[] = "60s";

class RestartE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::LocalClusterOptions options;
    options.checkpoint_service = true;
    options.agent_stop_grace = kStopGrace;
    cluster_ = std::make_unique<testing::LocalCluster>(options);
    ASSERT_TRUE(cluster_->Start());
  }

  std::string Submit() {
    return cluster_
        ->Submit(ParseJobSpec(
            "model: {mlp: {layers: [32, 64, 4]}}\n"
            "dataset: {synthetic: {numSamples: 4096, numFeatures: 32, numClasses: 4}}\n"
            "optimizer: {sgd: {lr: 0.05}}\n"
            "batchSizePerRank: 16\n"
            "maxSteps: 10000000\n"
            "logEverySteps: 10\n"
            "checkpoint: {everySteps: 25}\n"
            "distributed: {worldSize: 4, ranksPerNode: 2}\n"
            "maxRestarts: {job: 2}\n"))
        .name();
  }

  // Whether rank 0 of `attempt` has logged a training step (RUNNING says only that every
  // rank started: a stop before the loop is another path), within 60 s.
  bool AwaitTraining(const std::string& name, int attempt) {
    const auto deadline = Clock::now() + seconds(60);
    while (Clock::now() < deadline) {
      for (const std::string& line : cluster_->Logs(name, attempt, 0)) {
        if (line.find("\"event\":\"progress\"") != std::string::npos) return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    return false;
  }

  bool AgentsSaid(const std::string& text) {
    return cluster_->AgentStderr("a").find(text) != std::string::npos ||
           cluster_->AgentStderr("b").find(text) != std::string::npos;
  }

  std::unique_ptr<testing::LocalCluster> cluster_;
};

TEST_F(RestartE2eTest, AFailedAttemptsSurvivorsAreKilledAtOnceAndACancelStillSavesFirst) {
  const std::string name = Submit();
  ASSERT_TRUE(AwaitTraining(name, 1)) << cluster_->Describe(name);
  std::vector<pid_t> trainers = cluster_->TrainersOf("a");
  for (pid_t pid : cluster_->TrainersOf("b")) trainers.push_back(pid);
  ASSERT_EQ(trainers.size(), 4u);
  const pid_t victim = trainers.back();
  trainers.pop_back();
  for (pid_t survivor : trainers) ASSERT_EQ(kill(survivor, SIGSTOP), 0);
  const auto killed = Clock::now();
  ASSERT_EQ(kill(victim, SIGKILL), 0);

  const v1::Job second = cluster_->AwaitJob(
      name,
      [](const v1::Job& j) {
        return Ended(j) || (j.attempt() == 2 && j.state() == v1::Job::RUNNING);
      },
      seconds(50));
  const double took = std::chrono::duration<double>(Clock::now() - killed).count();
  ASSERT_EQ(second.attempt(), 2) << second.state_reason() << "\n" << cluster_->Describe(name);
  ASSERT_EQ(second.state(), v1::Job::RUNNING) << cluster_->Describe(name);
  std::cout << "[ measured ] a rank SIGKILLed, its 3 survivors SIGSTOPped, to attempt 2 RUNNING: "
            << took << " s (stop grace " << kStopGrace << ")" << std::endl;
  EXPECT_LT(took, 20) << "the survivors waited for the stop grace";
  EXPECT_TRUE(AgentsSaid(name + " attempt 1 rank")) << "no agent named attempt 1";
  EXPECT_TRUE(AgentsSaid("killing " + name + " attempt 1 rank"))
      << cluster_->AgentStderr("a") << cluster_->AgentStderr("b");
  EXPECT_FALSE(AgentsSaid("stopping " + name + " attempt 1 rank"))
      << "a survivor got SIGTERM and the grace";

  // A cancel is graceful: SIGTERM, and rank 0 leaves after the step it finished (its save is
  // refused once the job is CANCELLING, and says so).
  ASSERT_TRUE(AwaitTraining(name, 2)) << cluster_->Describe(name);
  cluster_->Cancel(name);
  const v1::Job cancelled = cluster_->AwaitJob(name, Ended, seconds(50));
  EXPECT_EQ(cancelled.state(), v1::Job::CANCELLED) << cluster_->Describe(name);
  EXPECT_TRUE(AgentsSaid("stopping " + name + " attempt 2 rank 0"));
  EXPECT_FALSE(AgentsSaid("killing " + name + " attempt 2"));
  std::string preempted, last;
  const auto deadline = Clock::now() + seconds(20);
  while (preempted.empty() && Clock::now() < deadline) {
    for (const std::string& line : cluster_->Logs(name, 2, 0)) {
      if (line.find("preempted: stopped after step") != std::string::npos) preempted = line;
      last = line;
    }
    if (preempted.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  EXPECT_FALSE(preempted.empty()) << "rank 0 of the cancelled attempt never saw a SIGTERM; its "
                                  << "last line: " << last;
}

}  // namespace
}  // namespace gradhub
