// AssignmentNotifier (services/api/assignment_notifier.h), the push behind the agents'
// WatchAssignments streams, with real threads: a change is a counter step that each waiter
// compares with the count it saw, so bursts coalesce, no change is missed, and a wait ends at
// its deadline (the stream's keepalive), on cancellation or at Shutdown.
#include "services/api/assignment_notifier.h"

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace gradhub::api {
namespace {

// Long enough never to pass in a test that works; a wait that reaches it has missed its wake.
constexpr absl::Duration kNever = absl::Seconds(20);
// What "at once" means on a loaded machine.
constexpr absl::Duration kPrompt = absl::Seconds(2);

// How long `wait` takes.
template <typename F>
absl::Duration Timed(F wait) {
  const absl::Time start = absl::Now();
  wait();
  return absl::Now() - start;
}

TEST(AssignmentNotifier, ANotifyBetweenReadingTheCountAndWaitingIsNotLost) {
  AssignmentNotifier notifier;
  const uint64_t seen = notifier.generation();  // 1. the stream reads the count
  notifier.Notify();                            // 2. a change while it reads the desired set
  uint64_t now = 0;
  const absl::Duration took =
      Timed([&] { now = notifier.WaitForChange(seen, absl::Now() + kNever, nullptr); });
  EXPECT_EQ(now, seen + 1);
  EXPECT_LT(took, kPrompt);
}

TEST(AssignmentNotifier, ABurstOfChangesIsOneWakeUpForEachWaiter) {
  AssignmentNotifier notifier;
  const uint64_t seen = notifier.generation();
  for (int i = 0; i < 1000; ++i) notifier.Notify();  // while every stream was busy reading
  std::vector<uint64_t> woke_at(4);
  std::vector<std::thread> waiters;
  for (size_t i = 0; i < woke_at.size(); ++i) {
    waiters.emplace_back(
        [&, i] { woke_at[i] = notifier.WaitForChange(seen, absl::Now() + kNever, nullptr); });
  }
  for (std::thread& waiter : waiters) waiter.join();
  for (const uint64_t count : woke_at) EXPECT_EQ(count, seen + 1000);  // one read covers all
  // And nothing more is pending: the next wait lasts until its deadline.
  const absl::Duration took = Timed([&] {
    EXPECT_EQ(notifier.WaitForChange(seen + 1000, absl::Now() + absl::Milliseconds(30), nullptr),
              seen + 1000);
  });
  EXPECT_GE(took, absl::Milliseconds(30));
}

// Waiters blocked while changes keep coming: each wakes with a newer count every time (never
// spuriously with the one it saw), and at most once per change; all of them see the last.
TEST(AssignmentNotifier, WaitersBlockedDuringABurstEachSeeTheLastChange) {
  AssignmentNotifier notifier;
  constexpr int kChanges = 2000;
  constexpr int kWaiters = 4;
  std::atomic<int> waiting{0};
  std::vector<int> wake_ups(kWaiters, 0);
  std::vector<std::thread> waiters;
  for (int i = 0; i < kWaiters; ++i) {
    waiters.emplace_back([&, i] {
      uint64_t seen = notifier.generation();
      ++waiting;
      while (seen < kChanges) {
        const uint64_t now = notifier.WaitForChange(seen, absl::Now() + kNever, nullptr);
        ASSERT_GT(now, seen) << "woke without a change, before the deadline";
        ++wake_ups[static_cast<size_t>(i)];
        seen = now;
      }
    });
  }
  while (waiting < kWaiters) std::this_thread::yield();
  const absl::Duration took = Timed([&] {
    for (int i = 0; i < kChanges; ++i) notifier.Notify();
    for (std::thread& waiter : waiters) waiter.join();
  });
  EXPECT_LT(took, kPrompt);
  for (const int count : wake_ups) {
    EXPECT_GE(count, 1);
    EXPECT_LE(count, kChanges);
  }
}

// The stream's loop, many times over, with a change racing each read: every change is seen
// at once, none waits for the deadline.
TEST(AssignmentNotifier, NoChangeIsMissedByAStreamReadingWhileItHappens) {
  AssignmentNotifier notifier;
  constexpr int kRounds = 300;
  std::mutex mu;
  std::condition_variable cv;
  int reads = 0;  // rounds in which the stream has read the count
  std::thread stream([&] {
    for (int round = 0; round < kRounds; ++round) {
      const uint64_t seen = notifier.generation();
      {
        std::lock_guard<std::mutex> lock(mu);
        ++reads;
      }
      cv.notify_one();
      // The change may land before, during or after this call begins.
      const uint64_t now = notifier.WaitForChange(seen, absl::Now() + kNever, nullptr);
      ASSERT_GT(now, seen) << "round " << round;
    }
  });
  const absl::Duration took = Timed([&] {
    for (int round = 0; round < kRounds; ++round) {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return reads > round; });
      lock.unlock();
      if (round % 3 == 1) std::this_thread::yield();
      notifier.Notify();
    }
    stream.join();
  });
  EXPECT_LT(took, kPrompt * 2);
}

// The stream waits at most until its keepalive is due, then sends the same set again.
TEST(AssignmentNotifier, AWaitWithoutAChangeEndsAtItsDeadline) {
  AssignmentNotifier notifier;
  const uint64_t seen = notifier.generation();
  uint64_t now = 1;
  absl::Duration took = Timed(
      [&] { now = notifier.WaitForChange(seen, absl::Now() + absl::Milliseconds(60), nullptr); });
  EXPECT_EQ(now, seen);
  EXPECT_GE(took, absl::Milliseconds(60));
  EXPECT_LT(took, kPrompt);
  // A keepalive already due: no wait at all.
  took = Timed([&] { notifier.WaitForChange(seen, absl::Now() - absl::Seconds(1), nullptr); });
  EXPECT_LT(took, absl::Milliseconds(50));
}

// A client that went away is noticed by polling cancelled(), within the poll interval (100 ms).
TEST(AssignmentNotifier, ACancelledWaitEndsWithinAPoll) {
  AssignmentNotifier notifier;
  const uint64_t seen = notifier.generation();
  EXPECT_LT(Timed([&] { notifier.WaitForChange(seen, absl::Now() + kNever, [] { return true; }); }),
            absl::Milliseconds(50));
  std::atomic<bool> gone{false};
  std::atomic<int> polls{0};
  std::thread client([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    gone = true;
  });
  uint64_t now = 1;
  const absl::Duration took = Timed([&] {
    now = notifier.WaitForChange(seen, absl::Now() + kNever, [&] {
      ++polls;
      return gone.load();
    });
  });
  client.join();
  EXPECT_EQ(now, seen);
  EXPECT_GE(took, absl::Milliseconds(30));
  EXPECT_LT(took, absl::Milliseconds(30) + absl::Milliseconds(100) + kPrompt / 4);
  EXPECT_GE(polls, 2);  // before the client went, and after
}

TEST(AssignmentNotifier, ShutdownEndsEveryWaitForGood) {
  AssignmentNotifier notifier;
  EXPECT_FALSE(notifier.shutting_down());
  const uint64_t seen = notifier.generation();
  std::atomic<int> waiting{0};
  std::vector<uint64_t> ended_at(3, 1);
  std::vector<std::thread> waiters;
  for (size_t i = 0; i < ended_at.size(); ++i) {
    waiters.emplace_back([&, i] {
      ++waiting;
      ended_at[i] = notifier.WaitForChange(seen, absl::Now() + kNever, nullptr);
    });
  }
  while (waiting < static_cast<int>(ended_at.size())) std::this_thread::yield();
  const absl::Duration took = Timed([&] {
    notifier.Shutdown();
    for (std::thread& waiter : waiters) waiter.join();
  });
  EXPECT_LT(took, kPrompt);
  for (const uint64_t count : ended_at) EXPECT_EQ(count, seen);  // no change: ended by Shutdown
  EXPECT_TRUE(notifier.shutting_down());
  EXPECT_LT(Timed([&] { notifier.WaitForChange(seen, absl::Now() + kNever, nullptr); }),
            absl::Milliseconds(50));
}

}  // namespace
}  // namespace gradhub::api
