// AsyncCheckpointWriter's protocol, rule by rule, over a sink that the test holds back.
#include "gpu_worker/trainer/async_checkpoint_writer.h"

#include <gtest/gtest.h>

#include <condition_variable>
#include <mutex>
#include <sstream>
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

}  // namespace
}  // namespace gradhub::trainer
