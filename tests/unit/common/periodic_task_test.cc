#include "services/common/periodic_task.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

namespace gradhub {
namespace {

using std::chrono::milliseconds;

void WaitFor(const std::atomic<int>& runs, int at_least) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (runs.load() < at_least && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(1));
  }
}

TEST(PeriodicTaskTest, RunsEveryIntervalUntilStopped) {
  std::atomic<int> runs{0};
  PeriodicTask task(absl::Milliseconds(10), [&] { ++runs; });
  task.Start();
  WaitFor(runs, 3);
  task.Stop();
  const int stopped_at = runs.load();
  EXPECT_GE(stopped_at, 3);
  std::this_thread::sleep_for(milliseconds(50));
  EXPECT_EQ(runs.load(), stopped_at);
  task.Stop();  // idempotent
}

TEST(PeriodicTaskTest, FirstRunWaitsAnIntervalByDefault) {
  std::atomic<int> runs{0};
  PeriodicTask task(absl::Hours(1), [&] { ++runs; });
  task.Start();
  std::this_thread::sleep_for(milliseconds(50));
  task.Stop();
  EXPECT_EQ(runs.load(), 0);
}

TEST(PeriodicTaskTest, AtStartRunsAtOnceThenEveryInterval) {
  std::atomic<int> runs{0};
  PeriodicTask task(
      absl::Hours(1), [&] { ++runs; }, PeriodicTask::FirstRun::kAtStart);
  task.Start();
  WaitFor(runs, 1);
  std::this_thread::sleep_for(milliseconds(20));
  task.Stop();
  EXPECT_EQ(runs.load(), 1);
}

TEST(PeriodicTaskTest, ZeroIntervalNeverRepeats) {
  std::atomic<int> never{0}, once{0};
  PeriodicTask off(absl::ZeroDuration(), [&] { ++never; });
  PeriodicTask at_start(
      absl::ZeroDuration(), [&] { ++once; }, PeriodicTask::FirstRun::kAtStart);
  off.Start();
  at_start.Start();
  WaitFor(once, 1);
  std::this_thread::sleep_for(milliseconds(20));
  off.Stop();
  at_start.Stop();
  EXPECT_EQ(never.load(), 0);
  EXPECT_EQ(once.load(), 1);
}

TEST(PeriodicTaskTest, StopEndsALongRunThatPollsStopping) {
  std::atomic<int> runs{0};
  std::atomic<bool> ended_early{false};
  PeriodicTask* self = nullptr;
  PeriodicTask task(
      absl::ZeroDuration(),
      [&] {
        ++runs;
        const auto limit = std::chrono::steady_clock::now() + std::chrono::seconds(30);
        while (!self->stopping() && std::chrono::steady_clock::now() < limit) {
          std::this_thread::sleep_for(milliseconds(1));
        }
        ended_early = self->stopping();
      },
      PeriodicTask::FirstRun::kAtStart);
  self = &task;
  task.Start();
  WaitFor(runs, 1);
  const auto before = std::chrono::steady_clock::now();
  task.Stop();
  EXPECT_LT(std::chrono::steady_clock::now() - before, std::chrono::seconds(5));
  EXPECT_TRUE(ended_early.load());
}

}  // namespace
}  // namespace gradhub
