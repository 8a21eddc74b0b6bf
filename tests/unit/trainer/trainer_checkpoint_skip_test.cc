// The training loop against a checkpoint store whose first save does not go out for a while
// (an outage, as far as the trainer can tell), in process, on the CPU: the periodic
// checkpoints that come due meanwhile are skipped and reported (a log line, a
// checkpoint_skipped record, the done record's count), the loop never waits for them, and the
// final checkpoint and a stop's wait for the save in flight instead of being lost.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

#include "gpu_worker/ddp/store/in_memory_store.h"
#include "gpu_worker/trainer/errors.h"
#include "gpu_worker/trainer/trainer.h"
#include "services/common/contract/job_spec.h"
#include "services/common/contract/progress_record.h"

namespace gradhub::trainer {
namespace {

using std::chrono::milliseconds;

// Holds its first save back for `delay`; records the steps saved, in order.
class SlowFirstSaveSink : public CheckpointSink {
 public:
  SlowFirstSaveSink(milliseconds delay, std::atomic<bool>* stop_on_first = nullptr)
      : delay_(delay), stop_on_first_(stop_on_first) {}

  void Save(const Checkpoint& checkpoint) override {
    bool first = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      first = saved_.empty() && !started_;
      started_ = true;
    }
    if (first && stop_on_first_ != nullptr) {
      // A SIGTERM while it uploads, once the loop has gone past the step it saves.
      std::this_thread::sleep_for(milliseconds(50));
      *stop_on_first_ = true;
    }
    if (first) std::this_thread::sleep_for(delay_);
    std::lock_guard<std::mutex> lock(mutex_);
    saved_.push_back(checkpoint.step);
  }
  std::optional<Checkpoint> LoadLatest() override { return std::nullopt; }
  std::vector<int64_t> saved() {
    std::lock_guard<std::mutex> lock(mutex_);
    return saved_;
  }

 private:
  const milliseconds delay_;
  std::atomic<bool>* const stop_on_first_;
  std::mutex mutex_;
  bool started_ = false;
  std::vector<int64_t> saved_;
};

v1::JobSpec Spec(int64_t steps) {
  return ParseJobSpec(
      "model: {mlp: {layers: [16, 32, 4]}}\n"
      "dataset: {synthetic: {numSamples: 512, numFeatures: 16, numClasses: 4}}\n"
      "optimizer: {sgd: {lr: 0.05, momentum: 0.9}}\n"
      "batchSizePerRank: 16\n"
      "logEverySteps: 2\n"
      "checkpoint: {everySteps: 2}\n"
      "maxSteps: " +
      std::to_string(steps) + "\n");
}

struct TrainedRun {
  TrainResult result;
  std::vector<ProgressRecord> records;
  std::string log;
  std::string preempted;  // what Preempted said, if thrown
};

TrainedRun Train(const v1::JobSpec& spec, std::shared_ptr<CheckpointSink> sink,
                 const std::atomic<bool>* stop = nullptr) {
  std::ostringstream progress, log;
  TrainerOptions options;
  options.store = std::make_shared<ddp::InMemoryStore>();
  options.threads = 1;
  options.checkpoints = std::move(sink);
  options.progress = &progress;
  options.log = &log;
  options.stop_requested = stop;
  TrainedRun run;
  try {
    run.result = trainer::Train(spec, options);
  } catch (const Preempted& preempted) {
    run.preempted = preempted.what();
  }
  std::istringstream lines(progress.str());
  for (std::string line; std::getline(lines, line);) {
    if (std::optional<ProgressRecord> record = ParseProgressRecord(line)) {
      run.records.push_back(*record);
    }
  }
  run.log = log.str();
  return run;
}

TEST(TrainerCheckpointSkipTest, CheckpointsDueWhileAnUploadIsInFlightAreSkippedAndSaid) {
  auto sink = std::make_shared<SlowFirstSaveSink>(milliseconds(1500));
  const TrainedRun run = Train(Spec(12), sink);
  // Step 2's save goes out slowly; 4..10 come due meanwhile (a tiny model's steps take
  // microseconds) and are skipped; the final one waits for step 2's and goes out.
  EXPECT_EQ(sink->saved(), (std::vector<int64_t>{2, 12}));
  EXPECT_EQ(run.result.checkpoints_saved, 2);
  EXPECT_EQ(run.result.checkpoints_skipped, 4);
  EXPECT_GE(run.result.checkpoint_wait_seconds, 1.0) << "the final save waited for step 2's";
  std::vector<int64_t> skipped;
  std::optional<ProgressRecord> done;
  for (const ProgressRecord& r : run.records) {
    if (r.event == ProgressEvent::kDone) done = r;
    if (r.event != ProgressEvent::kCheckpointSkipped) continue;
    skipped.push_back(r.step);
    EXPECT_EQ(r.checkpoint_in_flight_step, 2);
    EXPECT_GE(r.checkpoint_in_flight_seconds.value_or(-1), 0);
  }
  EXPECT_EQ(skipped, (std::vector<int64_t>{4, 6, 8, 10}));
  ASSERT_TRUE(done.has_value());
  EXPECT_EQ(done->checkpoints_skipped, 4);
  EXPECT_NE(run.log.find("gradhub-trainer: checkpoint at step 4 skipped: the upload of step 2 "
                         "has been going out for "),
            std::string::npos)
      << run.log;
  // Skipping changes nothing in training: the same parameters as a run without checkpoints.
  // (Not a run whose sink saves at once: its writer thread may still be busy when the next
  // checkpoint comes due two tiny steps later, on a loaded machine, and that one is skipped.)
  const TrainedRun plain = Train(Spec(12), nullptr);
  EXPECT_EQ(plain.result.parameters_sha256, run.result.parameters_sha256);
  EXPECT_EQ(plain.result.checkpoints_skipped, 0);
}

// A stop request while step 2's save is still going out: rank 0 saves the step it finished
// after waiting for that save, rather than skipping it.
TEST(TrainerCheckpointSkipTest, AStopWaitsForTheUploadInFlightAndSavesItsStep) {
  std::atomic<bool> stop{false};
  auto sink = std::make_shared<SlowFirstSaveSink>(milliseconds(500), &stop);
  const TrainedRun run = Train(Spec(1000), sink, &stop);
  ASSERT_FALSE(run.preempted.empty()) << "not stopped";
  const std::vector<int64_t> saved = sink->saved();
  ASSERT_EQ(saved.size(), 2u);
  EXPECT_EQ(saved[0], 2);
  EXPECT_GT(saved[1], 2);
  EXPECT_NE(run.preempted.find("checkpoint of step " + std::to_string(saved[1]) + " committed"),
            std::string::npos)
      << run.preempted;
}

}  // namespace
}  // namespace gradhub::trainer
