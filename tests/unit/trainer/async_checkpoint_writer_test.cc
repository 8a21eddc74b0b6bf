// AsyncCheckpointWriter's protocol, rule by rule, over a sink that the test holds back (an
// unreachable store, as far as the writer can tell).
#include "gpu_worker/trainer/async_checkpoint_writer.h"

#include <gtest/gtest.h>
#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <condition_variable>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace gradhub::trainer {
namespace {

using std::chrono::milliseconds;

// Save blocks until the test releases it; records what it saved.
class GatedSink : public CheckpointSink {
 public:
  void Save(const Checkpoint& checkpoint) override {
    std::unique_lock<std::mutex> lock(mutex_);
    started_.push_back(checkpoint.step);
    saver_ = gettid();
    policies_.push_back({sched_getscheduler(0), -1});
    changed_.notify_all();
    changed_.wait(lock, [&] { return released_ > static_cast<int>(saved_.size()); });
    policies_.back().second = sched_getscheduler(0);
    if (fail_) throw std::runtime_error("store unreachable");
    saved_.push_back(checkpoint.step);
  }
  std::optional<Checkpoint> LoadLatest() override { return std::nullopt; }

  void Release(bool fail = false) {
    std::lock_guard<std::mutex> lock(mutex_);
    fail_ = fail;
    ++released_;
    changed_.notify_all();
  }
  void AwaitStarted(size_t n) {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [&] { return started_.size() >= n; });
  }
  std::vector<int64_t> saved() {
    std::lock_guard<std::mutex> lock(mutex_);
    return saved_;
  }
  // The scheduling policy of the thread running the last save, now.
  int saver_policy() {
    std::lock_guard<std::mutex> lock(mutex_);
    return sched_getscheduler(saver_);
  }
  // Each save's scheduling policy when it started and when it was released.
  std::vector<std::pair<int, int>> policies() {
    std::lock_guard<std::mutex> lock(mutex_);
    return policies_;
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<int64_t> started_, saved_;
  std::vector<std::pair<int, int>> policies_;
  pid_t saver_ = 0;
  int released_ = 0;
  bool fail_ = false;
};

TEST(AsyncCheckpointWriterTest, SubmitReturnsWhileTheSaveRuns) {
  auto sink = std::make_shared<GatedSink>();
  std::ostringstream log;
  AsyncCheckpointWriter writer(sink, &log);
  EXPECT_LT(writer.Submit({10, "a"}), 0.01) << "nothing was in flight to wait for";
  sink->AwaitStarted(1);
  EXPECT_FALSE(writer.Flush(milliseconds(50)).has_value()) << "the save is still held back";
  sink->Release();
  auto outcome = writer.Flush(milliseconds(5000));
  ASSERT_TRUE(outcome.has_value());
  EXPECT_EQ(outcome->step, 10);
  EXPECT_TRUE(outcome->error.empty());
  EXPECT_EQ(sink->saved(), std::vector<int64_t>{10});
}

TEST(AsyncCheckpointWriterTest, AtMostOneSaveInFlightSoTheNextSubmitWaits) {
  auto sink = std::make_shared<GatedSink>();
  std::ostringstream log;
  AsyncCheckpointWriter writer(sink, &log);
  writer.Submit({10, "a"});
  sink->AwaitStarted(1);
  std::thread release([&] {
    std::this_thread::sleep_for(milliseconds(100));
    sink->Release();
  });
  const double waited = writer.Submit({20, "b"});
  release.join();
  EXPECT_GE(waited, 0.08);
  EXPECT_EQ(writer.last_submitted_step(), 20);
  sink->Release();
  ASSERT_TRUE(writer.Flush(milliseconds(5000)).has_value());
  EXPECT_EQ(sink->saved(), (std::vector<int64_t>{10, 20}));
}

TEST(AsyncCheckpointWriterTest, AFailedSaveIsLoggedAndReportedByFlush) {
  auto sink = std::make_shared<GatedSink>();
  std::ostringstream log;
  AsyncCheckpointWriter writer(sink, &log);
  writer.Submit({30, "c"});
  sink->Release(/*fail=*/true);
  auto outcome = writer.Flush(milliseconds(5000));
  ASSERT_TRUE(outcome.has_value());
  EXPECT_EQ(outcome->step, 30);
  EXPECT_EQ(outcome->error, "store unreachable");
  EXPECT_NE(log.str().find("checkpoint of step 30 was not saved"), std::string::npos) << log.str();
}

TEST(AsyncCheckpointWriterTest, DestructionWaitsForTheSaveInFlight) {
  auto sink = std::make_shared<GatedSink>();
  {
    std::ostringstream log;
    AsyncCheckpointWriter writer(sink, &log);
    writer.Submit({40, "d"});
    sink->AwaitStarted(1);
    std::thread release([&] {
      std::this_thread::sleep_for(milliseconds(50));
      sink->Release();
    });
    release.detach();
  }
  EXPECT_EQ(sink->saved(), std::vector<int64_t>{40}) << "a checkpoint is never thrown away";
}

TEST(AsyncCheckpointWriterTest, InFlightNamesTheSaveRunningAndForHowLong) {
  auto sink = std::make_shared<GatedSink>();
  std::ostringstream log;
  AsyncCheckpointWriter writer(sink, &log);
  EXPECT_FALSE(writer.in_flight().has_value()) << "idle before any save";
  writer.Submit({10, "a"});
  std::this_thread::sleep_for(milliseconds(60));
  const std::optional<InFlightSave> running = writer.in_flight();
  ASSERT_TRUE(running.has_value());
  EXPECT_EQ(running->step, 10);
  EXPECT_GE(running->seconds, 0.05);
  EXPECT_LT(running->seconds, 5.0);
  sink->Release();
  ASSERT_TRUE(writer.Flush(milliseconds(5000)).has_value());
  EXPECT_FALSE(writer.in_flight().has_value()) << "the save ended";
}

TEST(AsyncCheckpointWriterTest, SkipRuleSkipsOnlyAPeriodicCheckpointWhileASaveIsInFlight) {
  const InFlightSave running{10, 3.5};
  EXPECT_TRUE(SkipCheckpoint(SaveUrgency::kSkippable, running));
  EXPECT_FALSE(SkipCheckpoint(SaveUrgency::kSkippable, std::nullopt));
  EXPECT_FALSE(SkipCheckpoint(SaveUrgency::kMustSave, running)) << "a final save is never lost";
  EXPECT_FALSE(SkipCheckpoint(SaveUrgency::kMustSave, std::nullopt));
}

// The training loop's use of the writer through an outage of the store: the save of step 10
// cannot go out, so the checkpoints of steps 20 and 30 are skipped without a wait and without
// a second copy queued; once it has gone out, step 40 goes out as usual; the final checkpoint
// (step 50) waits for step 40's save instead of being skipped.
TEST(AsyncCheckpointWriterTest, ThroughAnOutageTheLoopSkipsAndNeverWaitsUntilTheFinalSave) {
  auto sink = std::make_shared<GatedSink>();
  std::ostringstream log;
  AsyncCheckpointWriter writer(sink, &log);
  std::vector<int64_t> skipped;
  // What Checkpointer::Save does with the rule; returns the seconds Submit waited.
  const auto save = [&](int64_t step, SaveUrgency urgency) {
    const std::optional<InFlightSave> running = writer.in_flight();
    if (SkipCheckpoint(urgency, running)) {
      EXPECT_EQ(running->step, 10) << "step " << step;
      skipped.push_back(step);
      return 0.0;
    }
    return writer.Submit({step, "bytes of " + std::to_string(step)});
  };
  EXPECT_LT(save(10, SaveUrgency::kSkippable), 0.01);
  sink->AwaitStarted(1);  // the store is unreachable: Save does not return
  const auto start = std::chrono::steady_clock::now();
  save(20, SaveUrgency::kSkippable);
  save(30, SaveUrgency::kSkippable);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 0.05)
      << "the loop waited on a save that cannot go out";
  EXPECT_EQ(skipped, (std::vector<int64_t>{20, 30}));
  EXPECT_EQ(writer.last_submitted_step(), 10) << "no second checkpoint held in memory";

  sink->Release();  // the store is back: step 10's save goes out
  ASSERT_TRUE(writer.Flush(milliseconds(5000)).has_value());
  EXPECT_LT(save(40, SaveUrgency::kSkippable), 0.01) << "the next one goes out as usual";
  sink->AwaitStarted(2);
  std::thread release([&] {
    std::this_thread::sleep_for(milliseconds(100));
    sink->Release();
  });
  EXPECT_GE(save(50, SaveUrgency::kMustSave), 0.08) << "the final save waits for step 40's";
  release.join();
  sink->Release();
  ASSERT_TRUE(writer.Flush(milliseconds(5000)).has_value());
  EXPECT_EQ(sink->saved(), (std::vector<int64_t>{10, 40, 50}));
  EXPECT_EQ(skipped, (std::vector<int64_t>{20, 30}));
}

// Records the scheduling policy of the thread that saves, and starts a thread that outlives
// the save (as gRPC's pools grow from whichever thread calls them).
class ThreadStartingSink : public CheckpointSink {
 public:
  ~ThreadStartingSink() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    changed_.notify_all();
    if (pool_thread_.joinable()) pool_thread_.join();
  }
  void Save(const Checkpoint&) override {
    save_policy = sched_getscheduler(0);
    pool_thread_ = std::thread([this] {
      std::unique_lock<std::mutex> lock(mutex_);
      pool_thread_id_ = gettid();
      pool_thread_start_policy_ = sched_getscheduler(0);
      changed_.notify_all();
      changed_.wait(lock, [&] { return stop_; });
    });
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [&] { return pool_thread_id_ != 0; });
  }
  std::optional<Checkpoint> LoadLatest() override { return std::nullopt; }
  int pool_thread_start_policy() {
    std::lock_guard<std::mutex> lock(mutex_);
    return pool_thread_start_policy_;
  }
  int pool_thread_policy_now() {
    std::lock_guard<std::mutex> lock(mutex_);
    return sched_getscheduler(pool_thread_id_);
  }
  int save_policy = -1;

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::thread pool_thread_;
  pid_t pool_thread_id_ = 0;
  int pool_thread_start_policy_ = -1;
  bool stop_ = false;
};

// A writer whose first save (step 10) has started and is held back, where saves run at idle
// priority at all (step 3d; elsewhere the test is skipped).
class IdleSaveTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!ThreadsMayLeaveIdlePriority()) GTEST_SKIP() << "threads may not leave idle priority";
    writer_.emplace(sink_, &log_);
    writer_->Submit({10, "a"});
    sink_->AwaitStarted(1);
  }

  std::shared_ptr<GatedSink> sink_ = std::make_shared<GatedSink>();
  std::ostringstream log_;
  std::optional<AsyncCheckpointWriter> writer_;
};

TEST_F(IdleSaveTest, SavesRunAtIdlePrioritySoTrainingKeepsEveryCore) {
  EXPECT_EQ(sched_getscheduler(0), SCHED_OTHER) << "the training thread keeps its priority";
  sink_->Release();
  while (writer_->in_flight().has_value()) std::this_thread::sleep_for(milliseconds(5));
  ASSERT_EQ(sink_->policies().size(), 1u);
  EXPECT_EQ(sink_->policies()[0], std::make_pair(SCHED_IDLE, SCHED_IDLE)) << log_.str();
}

TEST_F(IdleSaveTest, ASaveTheLoopWaitsForGoesBackToNormalPriority) {
  std::thread flusher([&] { EXPECT_TRUE(writer_->Flush(milliseconds(5000)).has_value()); });
  for (int i = 0; i < 500 && sink_->saver_policy() != SCHED_OTHER; ++i) {
    std::this_thread::sleep_for(milliseconds(10));  // until Flush has raised it
  }
  sink_->Release();
  flusher.join();
  // The next save, not waited for, is idle again from its start.
  writer_->Submit({20, "b"});
  sink_->AwaitStarted(2);
  sink_->Release();
  ASSERT_TRUE(writer_->Flush(milliseconds(5000)).has_value());
  const std::vector<std::pair<int, int>> policies = sink_->policies();
  ASSERT_EQ(policies.size(), 2u);
  EXPECT_EQ(policies[0], std::make_pair(SCHED_IDLE, SCHED_OTHER)) << log_.str();
  EXPECT_EQ(policies[1].first, SCHED_IDLE);
  EXPECT_EQ(log_.str().find("stays at idle priority"), std::string::npos) << log_.str();
}

TEST(AsyncCheckpointWriterTest, ThreadsASaveStartedGoBackToNormalPriorityWhenItEnds) {
  if (!ThreadsMayLeaveIdlePriority()) GTEST_SKIP() << "threads may not leave idle priority";
  auto sink = std::make_shared<ThreadStartingSink>();
  std::ostringstream log;
  AsyncCheckpointWriter writer(sink, &log);
  writer.Submit({10, "a"});
  while (sink->pool_thread_start_policy() == -1) std::this_thread::sleep_for(milliseconds(5));
  while (writer.in_flight().has_value()) std::this_thread::sleep_for(milliseconds(5));
  EXPECT_EQ(sink->save_policy, SCHED_IDLE) << log.str();
  EXPECT_EQ(sink->pool_thread_start_policy(), SCHED_IDLE) << "inherited from the save";
  EXPECT_EQ(sink->pool_thread_policy_now(), SCHED_OTHER);
}

// A save's scheduling policy, for a writer where threads may not go back to normal priority.
class PolicySink : public CheckpointSink {
 public:
  void Save(const Checkpoint&) override { policy = sched_getscheduler(0); }
  std::optional<Checkpoint> LoadLatest() override { return std::nullopt; }
  int policy = -1;
};

bool SavesAtNormalPriorityAndSaysSo() {
  auto sink = std::make_shared<PolicySink>();
  std::ostringstream log;
  {
    AsyncCheckpointWriter writer(sink, &log);
    writer.Submit({10, "a"});
    if (!writer.Flush(milliseconds(5000)).has_value()) return false;
  }
  return sink->policy == SCHED_OTHER &&
         log.str().find("checkpoints are saved at normal priority") != std::string::npos;
}

// Where no thread may be put back (a rank without RLIMIT_NICE 20), an idle save could starve
// while training waits for it: saves stay at normal priority. Where threads may be raised, a
// child gives that up first (root becomes nobody).
TEST(AsyncCheckpointWriterTest, WhereAThreadMayNotGoBackSavesRunAtNormalPriority) {
  if (!ThreadsMayLeaveIdlePriority()) {
    EXPECT_TRUE(SavesAtNormalPriorityAndSaysSo());
    return;
  }
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // No RLIMIT_NICE, and no root's CAP_SYS_NICE either.
    const rlimit no_raising{0, 0};
    if (setrlimit(RLIMIT_NICE, &no_raising) != 0) _exit(2);
    if (geteuid() == 0 &&
        (setresgid(65534, 65534, 65534) != 0 || setresuid(65534, 65534, 65534) != 0)) {
      _exit(2);
    }
    _exit(SavesAtNormalPriorityAndSaysSo() ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "2: could not become nobody; 1: the save ran idle";
}

}  // namespace
}  // namespace gradhub::trainer
