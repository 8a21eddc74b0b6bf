// GroupCommit (services/common/group_commit.h) with threads and a write that records its
// batches: every caller gets its own item's result, a lone call is written at once, calls that
// queue share batches of at most max_batch, and the oldest are written first.
#include "services/common/group_commit.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

namespace gradhub {
namespace {

// A write that doubles each item, takes `delay`, and keeps the batches it was given.
struct Recorder {
  std::chrono::milliseconds delay{0};
  std::mutex mu;
  std::vector<std::vector<int>> batches;
  std::atomic<int> in_flight{0}, most_in_flight{0};

  std::vector<int> Write(const std::vector<const int*>& items) {
    const int now = ++in_flight;
    if (now > most_in_flight) most_in_flight = now;
    std::this_thread::sleep_for(delay);
    std::vector<int> results;
    std::vector<int> batch;
    for (const int* item : items) {
      results.push_back(*item * 2);
      batch.push_back(*item);
    }
    {
      std::lock_guard lock(mu);
      batches.push_back(batch);
    }
    --in_flight;
    return results;
  }
};

TEST(GroupCommitTest, ALoneCallIsWrittenAtOnceAlone) {
  Recorder recorder;
  GroupCommit<int, int> commit([&](const auto& items) { return recorder.Write(items); }, 8);
  EXPECT_EQ(commit.Submit(21), 42);
  EXPECT_EQ(commit.Submit(5), 10);
  ASSERT_EQ(recorder.batches.size(), 2u);
  EXPECT_EQ(recorder.batches[0], std::vector<int>{21});
}

TEST(GroupCommitTest, CallsThatQueueShareBatchesAndEachGetsItsOwnResult) {
  Recorder recorder;
  recorder.delay = std::chrono::milliseconds(20);
  GroupCommit<int, int> commit([&](const auto& items) { return recorder.Write(items); }, 4);
  constexpr int kCallers = 24;
  std::vector<int> results(kCallers, -1);
  std::vector<std::thread> callers;
  for (int i = 0; i < kCallers; ++i) {
    callers.emplace_back([&, i] { results[i] = commit.Submit(i); });
  }
  for (std::thread& caller : callers) caller.join();
  for (int i = 0; i < kCallers; ++i) EXPECT_EQ(results[i], 2 * i) << i;
  EXPECT_EQ(recorder.most_in_flight, 1) << "one batch at a time";
  size_t items = 0;
  for (const std::vector<int>& batch : recorder.batches) {
    EXPECT_LE(batch.size(), 4u);
    items += batch.size();
  }
  EXPECT_EQ(items, static_cast<size_t>(kCallers)) << "every item written once";
  EXPECT_LT(recorder.batches.size(), static_cast<size_t>(kCallers)) << "batches formed";
}

}  // namespace
}  // namespace gradhub
