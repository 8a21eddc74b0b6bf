// Checkpoints through gradhub-checkpoint end to end: real PostgreSQL, api, checkpoint
// service, two agents with separate work directories (no shared checkpoint root) and real
// trainers. Each test ends a job whose run was broken somewhere and compares its parameters
// with an uninterrupted run of the same spec: resume must be exact, bit for bit.
#include <gtest/gtest.h>
#include <signal.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <regex>
#include <thread>

#include "services/common/contract/job_spec.h"
#include "services/common/sha256.h"
#include "tests/e2e/checkpoint/checkpoint_checks.h"
#include "tests/support/local_cluster.h"

namespace gradhub {
namespace {

namespace fs = std::filesystem;
using std::chrono::seconds;
using testing::FinalLoss;
using testing::FinalParameters;
using testing::LocalCluster;
using Clock = std::chrono::steady_clock;

constexpr int64_t kSteps = 3000;
constexpr int64_t kCheckpointEvery = 200;

// The reference run's final loss must stay above this: the parameters still move at the end.
constexpr double kLossFloor = 0.01;

// World 2 on one node; checkpoints (parameters and momentum) of ~1.3 MB every 200 steps, so an
// upload is in flight for a noticeable time. `hidden` sizes the model (and so the checkpoint and
// the step time: ~2 ms a step at 384 and ~8 ms at 1024, measured with the trainers alone).
// Noisy data, many samples, a small lr: the loss stays near 0.3 to the end (8000 steps are ~4
// epochs, too few to memorize the noise), so the parameters still move ~9% of their norm in
// the last 200 steps. With noise 0.5, 4096 samples and lr 0.05 the loss was 1e-7 by step 40,
// before the first kill: the parameters moved 1e-5 of their norm in 200 steps and 80% of them
// not by one bit, so a resume that lost state there could still end bit for bit.
v1::JobSpec Spec(int hidden = 384, int64_t steps = kSteps) {
  const std::string h = std::to_string(hidden);
  return ParseJobSpec(
      "model: {mlp: {layers: [32, " + h + ", " + h +
      ", 4]}}\n"
      "dataset: {synthetic: {numSamples: 65536, numFeatures: 32, numClasses: 4, noise: 5},"
      " validationFraction: 0.1}\n"
      "optimizer: {sgd: {lr: 0.01, momentum: 0.9}}\n"
      "batchSizePerRank: 16\n"
      "maxSteps: " +
      std::to_string(steps) +
      "\n"
      "logEverySteps: 20\n"
      "checkpoint: {everySteps: " +
      std::to_string(kCheckpointEvery) +
      ", keepLast: 2}\n"
      "distributed: {worldSize: 2, ranksPerNode: 2}\n"
      "maxRestarts: {infrastructure: 5, job: 2}\n");
}

class CheckpointE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::LocalClusterOptions options;
    options.checkpoint_service = true;
    cluster_ = std::make_unique<LocalCluster>(options);
    ASSERT_TRUE(cluster_->Start());
  }

  // The uninterrupted run's parameters, computed once per spec for the whole binary. Its
  // final loss shows the parameters still moved at the end, so the comparison has teeth.
  std::string Reference(const v1::JobSpec& spec) {
    static std::map<std::string, std::string> known;
    const std::string key = spec.SerializeAsString();
    if (known.count(key)) return known[key];
    const v1::Job job = cluster_->AwaitJob(cluster_->Submit(spec).name(), testing::Ended);
    EXPECT_EQ(job.state(), v1::Job::SUCCEEDED) << job.state_reason();
    EXPECT_EQ(job.attempt(), 1);
    known[key] = FinalParameters(*cluster_, job.name());
    const double loss = FinalLoss(*cluster_, job.name());
    std::printf("reference final loss %g\n", loss);
    EXPECT_GT(loss, kLossFloor) << "the loss vanished, so would the gradients: see Spec()";
    return known[key];
  }

  // Waits until the job runs attempt `attempt` at a step past `step`; returns the job.
  v1::Job AwaitRunningPast(const std::string& name, int attempt, int64_t step) {
    return cluster_->AwaitJob(name, [&](const v1::Job& j) {
      return testing::Ended(j) || (j.attempt() == attempt && j.state() == v1::Job::RUNNING &&
                                   j.progress().step() > step);
    });
  }

  std::vector<v1::Checkpoint> Checkpoints(const std::string& job) {
    return testing::ListedCheckpoints(*cluster_, job);
  }
  std::vector<v1::Checkpoint> Committed(const std::string& job) {
    std::vector<v1::Checkpoint> committed;
    for (const auto& c : Checkpoints(job)) {
      if (c.state() == v1::Checkpoint::COMMITTED) committed.push_back(c);
    }
    return committed;
  }

  std::unique_ptr<LocalCluster> cluster_;
};

// Two agents, no shared disk: the agent running the job is SIGKILLed at a random step between
// two checkpoints, three times; each time the job moves to the other node and resumes from
// the store. It ends with the reference parameters.
TEST_F(CheckpointE2eTest, ExactResumeOnTheOtherNodeAfterAgentKills) {
  const std::string reference = Reference(Spec());
  ASSERT_EQ(reference.size(), 64u);
  const std::string name = cluster_->Submit(Spec()).name();
  std::mt19937 random(std::random_device{}());
  int64_t last_kill_step = 0;
  for (int kill = 1; kill <= 3; ++kill) {
    // A step past the next checkpoint, and not on one.
    const int64_t after = last_kill_step + kCheckpointEvery +
                          std::uniform_int_distribution<int64_t>(10, kCheckpointEvery - 40)(random);
    const v1::Job running = AwaitRunningPast(name, kill, after);
    ASSERT_EQ(running.state(), v1::Job::RUNNING)
        << running.state_reason() << cluster_->Describe(name);
    const std::string victim = cluster_->AgentRunningTrainers();
    ASSERT_FALSE(victim.empty());
    last_kill_step = running.progress().step();
    cluster_->KillAgent(victim, SIGKILL);
    const v1::Job moved = cluster_->AwaitJob(name, [&](const v1::Job& j) {
      return testing::Ended(j) || (j.attempt() == kill + 1 && j.state() == v1::Job::RUNNING);
    });
    ASSERT_EQ(moved.attempt(), kill + 1) << moved.state_reason() << cluster_->Describe(name);
    ASSERT_TRUE(cluster_->StartAgent(victim));  // back for the next kill
  }
  const v1::Job done = cluster_->AwaitJob(name, testing::Ended, seconds(300));
  ASSERT_EQ(done.state(), v1::Job::SUCCEEDED) << done.state_reason() << cluster_->Describe(name);
  EXPECT_EQ(FinalParameters(*cluster_, name), reference);
  // Every resume was from the store: each later attempt's rank 0 says so.
  for (int attempt = 2; attempt <= 4; ++attempt) {
    bool resumed = false;
    for (const auto& line : cluster_->Logs(name, attempt, 0)) {
      resumed |= line.find("resumed from step") != std::string::npos;
    }
    EXPECT_TRUE(resumed) << "attempt " << attempt;
  }
  // Retention: exactly keepLast committed checkpoints remain.
  EXPECT_EQ(Committed(name).size(), 2u);
}

// A drain stops the job's ranks with SIGTERM: rank 0 finishes its step, commits a checkpoint
// of exactly that step and leaves; the next attempt, on the other node, resumes from it (not
// from the last periodic checkpoint) and ends with the reference parameters.
TEST_F(CheckpointE2eTest, DrainHandsOverAtTheStepRankZeroStopped) {
  // Long enough that the drain (a scheduler pass, a heartbeat, SIGTERM) lands mid-run.
  const v1::JobSpec spec = Spec(384, 8000);
  const std::string reference = Reference(spec);
  const std::string name = cluster_->Submit(spec).name();
  const v1::Job running = AwaitRunningPast(name, 1, kCheckpointEvery + 30);
  ASSERT_EQ(running.state(), v1::Job::RUNNING) << running.state_reason();
  const std::string drained = cluster_->AgentRunningTrainers();
  ASSERT_FALSE(drained.empty());
  ASSERT_TRUE(cluster_->Drain(drained));
  const v1::Job done = cluster_->AwaitJob(name, testing::Ended, seconds(300));
  ASSERT_EQ(done.state(), v1::Job::SUCCEEDED) << done.state_reason() << cluster_->Describe(name);
  EXPECT_EQ(done.attempt(), 2) << cluster_->Describe(name);
  EXPECT_EQ(FinalParameters(*cluster_, name), reference);
  std::string stopped, resumed;
  std::smatch match;
  for (const auto& line : cluster_->Logs(name, 1, 0)) {
    static const std::regex kStopped(
        "stopped after step ([0-9]+); checkpoint of step [0-9]+ committed");
    if (std::regex_search(line, match, kStopped)) stopped = match[1].str();
  }
  for (const auto& line : cluster_->Logs(name, 2, 0)) {
    static const std::regex kResumed("resumed from step ([0-9]+)");
    if (std::regex_search(line, match, kResumed)) resumed = match[1].str();
  }
  if (stopped.empty()) {
    for (const auto& line : cluster_->Logs(name, 1, 0))
      std::cerr << "attempt 1 rank 0: " << line << "\n";
  }
  ASSERT_FALSE(stopped.empty()) << "rank 0 did not save on SIGTERM";
  EXPECT_EQ(resumed, stopped);
}

// gradhub-checkpoint SIGKILLed while rank 0 uploads, then restarted on the same data: no
// partial checkpoint is ever listed, the upload resumes or restarts, and the job still ends
// with the reference parameters.
TEST_F(CheckpointE2eTest, CheckpointServiceKilledMidUploadLosesNothing) {
  const v1::JobSpec spec = Spec(/*hidden=*/1024);  // ~8.7 MB checkpoints
  const std::string reference = Reference(spec);
  const std::string name = cluster_->Submit(spec).name();
  // Kill as soon as an upload is seen in flight.
  bool killed = false;
  const auto deadline = Clock::now() + seconds(120);
  while (!killed && Clock::now() < deadline) {
    for (const auto& c : Checkpoints(name)) {
      if (c.state() == v1::Checkpoint::UPLOADING) {
        cluster_->KillCheckpointService(SIGKILL);
        killed = true;
        break;
      }
    }
    if (testing::Ended(cluster_->Get(name))) break;
  }
  ASSERT_TRUE(killed) << "never saw an upload in flight";
  std::this_thread::sleep_for(seconds(2));  // the trainer retries against a dead service
  ASSERT_TRUE(cluster_->StartCheckpointService());
  // Whatever the restarted service lists as committed is whole: served in full, matching the
  // size and sha256 it announces.
  for (const auto& c : Checkpoints(name)) {
    if (c.state() != v1::Checkpoint::COMMITTED) continue;
    const std::string bytes = testing::DownloadCheckpoint(*cluster_, c.name());
    EXPECT_EQ(static_cast<int64_t>(bytes.size()), c.size_bytes()) << c.name();
    EXPECT_EQ(Sha256Hex(bytes), c.sha256()) << c.name();
  }
  const v1::Job done = cluster_->AwaitJob(name, testing::Ended, seconds(300));
  ASSERT_EQ(done.state(), v1::Job::SUCCEEDED) << done.state_reason() << cluster_->Describe(name);
  EXPECT_EQ(done.attempt(), 1) << "a store outage must not fail the attempt";
  EXPECT_EQ(FinalParameters(*cluster_, name), reference);
  bool half_written = false;
  for (const auto& c : Checkpoints(name)) {
    EXPECT_NE(c.state(), v1::Checkpoint::UPLOADING) << c.name() << " left half-written";
    half_written |= c.state() == v1::Checkpoint::UPLOADING;
  }
  if (half_written) {
    for (const auto& line : cluster_->Logs(name, 1, 0)) {
      if (line.find("checkpoint") != std::string::npos) std::cerr << "rank 0: " << line << "\n";
    }
  }
}

// The newest committed blob has one byte flipped on disk. The next attempt (on the other
// node, whose cache does not have it) is refused it, falls back to the previous checkpoint,
// the job's events say so, and the job still ends with the reference parameters.
// Which checkpoint is the newest is read only once attempt 1 can no longer commit one:
//   1. the other node is cordoned, so the next attempt waits for the test;
//   2. the agent running the job is SIGKILLed, and its ranks with it. A CommitCheckpoint that
//      rank 0 sent just before still completes in the store (CI saw step 600 commit after the
//      kill, so the test flipped a byte of 400 and the job resumed from an intact 600);
//   3. the node is lost (the 3 s lease) and the job waits in RESTARTING; the committed list
//      is read when it has not changed for a second;
//   4. the newest blob is corrupted, and only then is the other node made READY again.
TEST_F(CheckpointE2eTest, CorruptNewestBlobFallsBackToThePreviousCheckpoint) {
  const std::string reference = Reference(Spec());
  const std::string name = cluster_->Submit(Spec()).name();
  const v1::Job running = AwaitRunningPast(name, 1, 2 * kCheckpointEvery + 20);
  ASSERT_EQ(running.state(), v1::Job::RUNNING) << running.state_reason();
  // Two committed: a save that comes due while the previous upload still goes out is skipped,
  // so on a loaded machine the step alone does not promise them.
  const auto deadline = std::chrono::steady_clock::now() + seconds(120);
  while (Committed(name).size() < 2 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const std::string victim = cluster_->AgentRunningTrainers();
  ASSERT_FALSE(victim.empty());
  const std::string other = victim == "a" ? "b" : "a";
  ASSERT_TRUE(cluster_->Cordon(other, true));                           // 1
  cluster_->KillAgent(victim, SIGKILL);                                 // 2
  const v1::Job lost = cluster_->AwaitJob(name, [](const v1::Job& j) {  // 3
    return testing::Ended(j) || j.state() == v1::Job::RESTARTING;
  });
  ASSERT_EQ(lost.state(), v1::Job::RESTARTING) << cluster_->Describe(name);
  std::vector<v1::Checkpoint> committed = Committed(name);
  for (auto unchanged_since = Clock::now(); Clock::now() - unchanged_since < seconds(1);) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::vector<v1::Checkpoint> now = Committed(name);
    if (now.size() != committed.size() ||
        (!now.empty() && now.front().step() != committed.front().step())) {
      committed = std::move(now);
      unchanged_since = Clock::now();
    }
  }
  ASSERT_GE(committed.size(), 2u);
  // Newest step first. The local blob store keeps it as blobs/<job id>/<step>-<upload id>.
  fs::path newest;
  const std::string prefix = std::to_string(committed[0].step()) + "-";
  for (const auto& entry : fs::directory_iterator(fs::path(cluster_->checkpoint_data_dir()) /
                                                  "blobs" / name.substr(5))) {
    if (entry.path().filename().string().rfind(prefix, 0) == 0) newest = entry.path();
  }
  ASSERT_FALSE(newest.empty()) << "no blob for step " << committed[0].step();
  {
    std::fstream blob(newest, std::ios::in | std::ios::out | std::ios::binary);
    blob.seekg(committed[0].size_bytes() / 2);
    char byte = 0;
    blob.read(&byte, 1);
    byte ^= 0x01;
    blob.seekp(committed[0].size_bytes() / 2);
    blob.write(&byte, 1);
  }
  ASSERT_TRUE(cluster_->Cordon(other, false));  // 4
  const v1::Job done = cluster_->AwaitJob(name, testing::Ended, seconds(300));
  ASSERT_EQ(done.state(), v1::Job::SUCCEEDED) << done.state_reason() << cluster_->Describe(name);
  EXPECT_EQ(FinalParameters(*cluster_, name), reference);
  bool corrupt_event = false;
  for (const auto& e : cluster_->Events(name))
    corrupt_event |= e.type() == v1::JobEvent::CHECKPOINT_CORRUPT;
  EXPECT_TRUE(corrupt_event) << cluster_->Describe(name);
  std::string resumed;
  for (const auto& line : cluster_->Logs(name, 2, 0)) {
    std::smatch match;
    static const std::regex kResumed("resumed from step ([0-9]+)");
    if (std::regex_search(line, match, kResumed)) resumed = match[1].str();
  }
  EXPECT_EQ(resumed, std::to_string(committed[1].step())) << "should resume from the previous one";
}

}  // namespace
}  // namespace gradhub
