// Script jobs (issue 31) through the real stack: PostgreSQL, gradhub-api, gradhub-checkpoint
// (code store and checkpoints), two agents, and Debian's Python with torch as the ranks:
//   - a DDP script written for torchrun runs unchanged as a world-4 job over two nodes;
//   - a script that checkpoints through the gradhub module (its reports reaching gradhub-metrics
//     as telemetry) resumes after a rank is killed, and after its whole agent is killed (on the
//     other node), ending with the parameters of an uninterrupted run, bit for bit; so does the
//     script-job example with gradhub's DDP (issue 32) after a rank is killed;
//   - a script exiting 3 fails as USER quoting its last lines; one that hangs after reporting
//     is caught by the watchdog;
//   - a script reads neither the node token (nor the servers' admin token, from their argv),
//     nor the agent's environment, nor another job's files.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <thread>

#include "tests/e2e/script/scripts.h"
#include "tests/support/local_cluster.h"

namespace gradhub {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr auto kJobLimit = std::chrono::seconds(240);

class ScriptJobsE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (access("/usr/bin/python3", X_OK) != 0 ||
        system("/usr/bin/python3 -c 'import torch' 2>/dev/null") != 0) {
      GTEST_SKIP() << "needs Debian's python3-torch at /usr/bin/python3";
    }
    testing::LocalClusterOptions options;
    options.checkpoint_service = true;
    options.metrics_service = true;
    cluster_ = std::make_unique<testing::LocalCluster>(options);
    ASSERT_TRUE(cluster_->Start());
  }

  // Packs {name: text} as a code directory and uploads it: the digest.
  std::string Upload(const std::map<std::string, std::string>& files) {
    return cluster_->UploadCode(files);
  }

  static v1::JobSpec Script(const std::string& digest, const std::string& entrypoint,
                            std::vector<std::string> args, int world_size) {
    v1::JobSpec spec;
    spec.set_display_name(entrypoint);
    spec.mutable_script()->set_code(digest);
    spec.mutable_script()->set_entrypoint(entrypoint);
    for (std::string& arg : args) spec.mutable_script()->add_args(std::move(arg));
    spec.mutable_distributed()->set_world_size(world_size);
    spec.set_hang_timeout_seconds(120);
    return spec;
  }

  v1::Job AwaitEnd(const std::string& name) {
    return cluster_->AwaitJob(name, testing::Ended, kJobLimit);
  }

  // The first group of `pattern` in rank `rank`'s lines of `attempt` (0 = the latest), waiting
  // up to 20 s for the agent to ship them ("" if they never come).
  std::string FindInLogs(const std::string& job, int attempt, int rank,
                         const std::string& pattern) {
    const std::regex regex(pattern);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    do {
      for (const std::string& line : cluster_->Logs(job, attempt, rank)) {
        std::smatch match;
        if (std::regex_search(line, match, regex)) return match.size() > 1 ? match[1].str() : line;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    } while (std::chrono::steady_clock::now() < deadline);
    return "";
  }

  // Waits until the job has a committed checkpoint and has gone past step `step`.
  bool AwaitCheckpointAndStep(const std::string& name, int64_t step) {
    const v1::Job job = cluster_->AwaitJob(
        name,
        [&](const v1::Job& job) {
          if (testing::Ended(job) || job.progress().step() < step) return testing::Ended(job);
          for (const v1::JobEvent& event : cluster_->Events(name)) {
            if (event.type() == v1::JobEvent::CHECKPOINT_COMMITTED) return true;
          }
          return false;
        },
        kJobLimit);
    return job.state() == v1::Job::RUNNING;
  }

  // The checkpointing script (scripts.h) as a world-2 job of 40 steps.
  v1::JobSpec CheckpointingJob() {
    return Script(Upload({{"ckpt.py", testing::kCheckpointingScript}}), "ckpt.py", {"40"}, 2);
  }

  // The script-job example (deploy/examples/script-job/code/train.py) with gradhub's DDP as a
  // world-2 job: 40 short steps, a checkpoint every 5, a report every 2.
  v1::JobSpec GradhubDdpExampleJob() {
    const char* source = std::getenv("GRADHUB_SOURCE_DIR");
    EXPECT_NE(source, nullptr) << "GRADHUB_SOURCE_DIR (ctest sets it)";
    std::ifstream in(std::string(source ? source : ".") +
                     "/deploy/examples/script-job/code/train.py");
    const std::string train((std::istreambuf_iterator<char>(in)), {});
    EXPECT_FALSE(train.empty()) << "the example's train.py";
    return Script(Upload({{"train.py", train}}), "train.py",
                  {"--ddp", "gradhub", "--max-steps", "40", "--save-every", "5", "--report-every",
                   "2", "--samples", "2048", "--hidden", "64", "--sleep-per-step", "0.1"},
                  2);
  }

  // The parameters' digest of an uninterrupted run of `spec`.
  std::string ReferenceDigest(const v1::JobSpec& spec) {
    const v1::Job job = AwaitEnd(cluster_->Submit(spec).name());
    EXPECT_EQ(job.state(), v1::Job::SUCCEEDED) << cluster_->Describe(job.name());
    return FindInLogs(job.name(), 0, 0, "final parameters sha256 ([0-9a-f]{64})");
  }

  // `spec`'s reference run, then the same job again (`restarts` its budgets), past its first
  // checkpoint: {reference digest, job name}, or a test failure.
  std::pair<std::string, std::string> ReferenceThenRunning(v1::JobSpec spec,
                                                           const v1::RestartPolicy& restarts) {
    const std::string reference = ReferenceDigest(spec);
    EXPECT_FALSE(reference.empty());
    *spec.mutable_max_restarts() = restarts;
    const std::string name = cluster_->Submit(spec).name();
    EXPECT_TRUE(AwaitCheckpointAndStep(name, 12)) << cluster_->Describe(name);
    return {reference, name};
  }

  // Rank 0 of `attempt` (0 = the latest) resumed from a step above 0 and ended with `reference`.
  void ExpectResumedBitForBit(const std::string& name, int attempt, const std::string& reference) {
    const std::string resumed = FindInLogs(name, attempt, 0, "resumed from step ([0-9]+)");
    EXPECT_GT(std::atoi(resumed.c_str()), 0) << cluster_->Describe(name);
    EXPECT_EQ(FindInLogs(name, attempt, 0, "final parameters sha256 ([0-9a-f]{64})"), reference);
  }

  // `spec` run whole, then again with its last rank on its node killed (SIGKILL) past its first
  // checkpoint: the job restarts once (maxRestarts.job 1), ends SUCCEEDED, and rank 0 of the
  // second attempt resumed and ended with the whole run's parameters. The job's name.
  std::string ExpectResumesAfterAKilledRank(v1::JobSpec spec) {
    v1::RestartPolicy restarts;
    restarts.set_job(1);
    const auto [reference, name] = ReferenceThenRunning(std::move(spec), restarts);
    if (HasFailure()) return name;
    const std::string agent = cluster_->RanksOf("a").empty() ? "b" : "a";
    const std::vector<pid_t> ranks = cluster_->RanksOf(agent);
    EXPECT_FALSE(ranks.empty()) << cluster_->Describe(name);
    if (!ranks.empty()) kill(ranks.back(), SIGKILL);
    const v1::Job job = AwaitEnd(name);
    EXPECT_EQ(job.state(), v1::Job::SUCCEEDED) << cluster_->Describe(name);
    EXPECT_EQ(job.attempt(), 2);
    ExpectResumedBitForBit(name, 2, reference);
    return name;
  }

  std::unique_ptr<testing::LocalCluster> cluster_;
};

TEST_F(ScriptJobsE2eTest, ATorchrunScriptRunsUnchangedAsAWorldFourJobOverTwoNodes) {
  const std::string digest = Upload({{"tutorial.py", testing::kTutorialScript}});
  v1::JobSpec spec = Script(digest, "tutorial.py", {"--epochs", "2"}, 4);
  spec.mutable_distributed()->set_ranks_per_node(2);
  const v1::Job job = AwaitEnd(cluster_->Submit(spec).name());
  ASSERT_EQ(job.state(), v1::Job::SUCCEEDED) << cluster_->Describe(job.name());
  std::set<std::string> group_ranks;
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_NE(FindInLogs(job.name(), 1, rank, "\\[rank " + std::to_string(rank) + "\\] epoch 1"),
              "")
        << "rank " << rank;
    group_ranks.insert(FindInLogs(job.name(), 1, rank, "of 4 done .* group_rank=([0-9])"));
  }
  EXPECT_EQ(group_ranks, (std::set<std::string>{"0", "1"}));  // two nodes
}

TEST_F(ScriptJobsE2eTest, AKilledRankResumesFromTheModulesCheckpointBitForBit) {
  const std::string name = ExpectResumesAfterAKilledRank(CheckpointingJob());
  ASSERT_FALSE(HasFailure());
  // The module's reports reached gradhub-metrics as telemetry, every rank to the last step.
  const std::string uuid = name.substr(std::strlen("jobs/"));
  for (const char* rank : {"0", "1"}) {
    const std::regex series("gradhub_training_step\\{[^}]*job_id=\"" + uuid + "\"[^}]*rank=\"" +
                            rank + "\"[^}]*\\} 40");
    bool seen = false;
    for (int tries = 0; tries < 50 && !seen; ++tries) {
      seen = std::regex_search(cluster_->ScrapeMetrics(), series);
      if (!seen) std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    EXPECT_TRUE(seen) << "rank " << rank << ":\n" << cluster_->ScrapeMetrics();
  }
}

// Issue 32's acceptance on the platform: the example with gradhub.DistributedDataParallel
// (the C++ engine through gradhub._C) resumes exactly after a rank is killed.
TEST_F(ScriptJobsE2eTest, TheExampleWithGradhubsDdpResumesAfterAKilledRankBitForBit) {
  const std::string name = ExpectResumesAfterAKilledRank(GradhubDdpExampleJob());
  // gradhub.distributed.init() found the other rank through gradhub-api's store (GRADHUB_STORE,
  // the rank's job token), not MASTER_PORT.
  EXPECT_NE(FindInLogs(name, 2, 0,
                       "trains on cpu with gradhub's DDP over gloo \\(ranks met through the "
                       "platform's store\\), world size 2"),
            "")
      << cluster_->Describe(name);
}

TEST_F(ScriptJobsE2eTest, ALostNodesJobResumesOnTheOtherNodeBitForBit) {
  v1::RestartPolicy restarts;
  restarts.set_infrastructure(2);
  const auto [reference, name] = ReferenceThenRunning(CheckpointingJob(), restarts);
  ASSERT_FALSE(HasFailure());
  const std::string victim = cluster_->RanksOf("a").empty() ? "b" : "a";
  const std::string survivor = victim == "a" ? "b" : "a";
  ASSERT_EQ(cluster_->RanksOf(victim).size(), 2u);  // both ranks packed on one node
  cluster_->KillAgent(victim, SIGKILL);
  const v1::Job job = AwaitEnd(name);
  ASSERT_EQ(job.state(), v1::Job::SUCCEEDED) << cluster_->Describe(name);
  EXPECT_THAT(cluster_->Describe(name), HasSubstr("placed on nodes/" + survivor));
  ExpectResumedBitForBit(name, 0, reference);
}

TEST_F(ScriptJobsE2eTest, ANonZeroExitFailsAsUserQuotingTheLastLines) {
  const std::string digest = Upload({{"fail.py", testing::kFailingScript}});
  v1::JobSpec spec = Script(digest, "fail.py", {}, 2);
  spec.mutable_max_restarts()->set_job(3);
  const v1::Job job = AwaitEnd(cluster_->Submit(spec).name());
  ASSERT_EQ(job.state(), v1::Job::FAILED) << cluster_->Describe(job.name());
  EXPECT_EQ(job.attempt(), 1);  // a user's failure is not retried
  EXPECT_THAT(job.state_reason(), HasSubstr("exited with code 3"));
  EXPECT_THAT(job.state_reason(), HasSubstr("ValueError: the dataset has no column 'label'"));
  EXPECT_THAT(job.state_reason(), HasSubstr("line 4, in <module>"));
}

TEST_F(ScriptJobsE2eTest, AScriptThatHangsAfterReportingIsCaughtByTheWatchdog) {
  const std::string digest = Upload({{"hang.py", testing::kHangingScript}});
  v1::JobSpec spec = Script(digest, "hang.py", {}, 1);
  spec.set_hang_timeout_seconds(8);
  const v1::Job job = AwaitEnd(cluster_->Submit(spec).name());
  ASSERT_EQ(job.state(), v1::Job::FAILED) << cluster_->Describe(job.name());
  EXPECT_THAT(cluster_->Describe(job.name()), HasSubstr("HANG_DETECTED"));
}

TEST_F(ScriptJobsE2eTest, AScriptReadsNeitherTheNodeTokenNorTheAgentNorAnotherJobsFiles) {
  if (geteuid() != 0) GTEST_SKIP() << "per-job users need a root agent";
  const std::string victim_code = Upload({{"victim.py", testing::kVictimScript}});
  const std::string victim = cluster_->Submit(Script(victim_code, "victim.py", {}, 1)).name();
  ASSERT_EQ(cluster_
                ->AwaitJob(
                    victim,
                    // Its progress can reach the api before the agent's report that moves the job
                    // to RUNNING: wait for both.
                    [](const v1::Job& job) {
                      return (job.state() == v1::Job::RUNNING && job.progress().step() >= 1) ||
                             testing::Ended(job);
                    },
                    kJobLimit)
                .state(),
            v1::Job::RUNNING);
  const std::string node = cluster_->RanksOf("a").empty() ? "b" : "a";
  const std::string secret = cluster_->dir() + "/agent-" + node + "/jobs/" +
                             victim.substr(std::strlen("jobs/")) + "/attempt-1/rank-0/secret.txt";
  ASSERT_TRUE(std::filesystem::exists(secret));
  const std::string attacker_code = Upload({{"attack.py", testing::kAttackerScript}});
  v1::JobSpec attack =
      Script(attacker_code, "attack.py", {std::to_string(cluster_->AgentPid(node)), secret}, 1);
  attack.mutable_node_selector()->clear();
  const v1::Job attacker = AwaitEnd(cluster_->Submit(attack).name());
  ASSERT_EQ(attacker.state(), v1::Job::SUCCEEDED) << cluster_->Describe(attacker.name());
  ASSERT_NE(FindInLogs(attacker.name(), 1, 0, "^env: "), "");  // its last line is shipped
  std::string output;
  for (const std::string& line : cluster_->Logs(attacker.name(), 1, 0)) output += line + "\n";
  EXPECT_THAT(output, HasSubstr("agent environ: PermissionError"));
  EXPECT_THAT(output, HasSubstr("other job file: PermissionError"));
  EXPECT_THAT(output, HasSubstr("other job dir: PermissionError"));
  EXPECT_THAT(output, Not(HasSubstr(cluster_->node_token())));
  EXPECT_THAT(output, Not(HasSubstr(testing::LocalCluster::kAdminToken)));  // servers' argv
  EXPECT_THAT(output, Not(HasSubstr("the victim's secret")));
  EXPECT_THAT(output, HasSubstr("GRADHUB_JOB_TOKEN=ghj_"));
  // Cancel: SIGTERM to the script's process group (it does not handle it), and it is gone.
  cluster_->Cancel(victim);
  EXPECT_EQ(cluster_->AwaitJob(victim, testing::Ended, std::chrono::seconds(30)).state(),
            v1::Job::CANCELLED);
  EXPECT_TRUE(cluster_->RanksOf(node).empty());
}

}  // namespace
}  // namespace gradhub
