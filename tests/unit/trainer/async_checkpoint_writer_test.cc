// AsyncCheckpointWriter's protocol, rule by rule, over a sink that the test holds back (an
// unreachable store, as far as the writer can tell).
#include "gpu_worker/trainer/async_checkpoint_writer.h"

#include <gtest/gtest.h>
#include <sched.h>

#include <condition_variable>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
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
    changed_.notify_all();
    changed_.wait(lock, [&] { return released_ > static_cast<int>(saved_.size()); });
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

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<int64_t> started_, saved_;
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

// Records the scheduling policy of the thread that saves, and of a thread that one starts.
class PolicyRecordingSink : public CheckpointSink {
 public:
  void Save(const Checkpoint&) override {
    save_policy = sched_getscheduler(0);
    std::thread helper([&] { helper_policy = sched_getscheduler(0); });
    helper.join();
  }
  std::optional<Checkpoint> LoadLatest() override { return std::nullopt; }
  int save_policy = -1, helper_policy = -1;
};

TEST(AsyncCheckpointWriterTest, SavesRunAtIdlePrioritySoTrainingKeepsEveryCore) {
  auto sink = std::make_shared<PolicyRecordingSink>();
  std::ostringstream log;
  AsyncCheckpointWriter writer(sink, &log);
  writer.Submit({10, "a"});
  ASSERT_TRUE(writer.Flush(milliseconds(5000)).has_value());
  EXPECT_EQ(sink->save_policy, SCHED_IDLE) << log.str();
  EXPECT_EQ(sink->helper_policy, SCHED_IDLE) << "threads a save starts inherit it";
  EXPECT_EQ(sched_getscheduler(0), SCHED_OTHER) << "the training thread keeps its priority";
}

}  // namespace
}  // namespace gradhub::trainer
