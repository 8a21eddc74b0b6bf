#include "services/common/backoff.h"

#include <gtest/gtest.h>

#include <set>

namespace gradhub {
namespace {

using std::chrono::milliseconds;
using std::chrono::nanoseconds;
using std::chrono::seconds;

TEST(BackoffTest, WithoutJitterDoublesFromInitialUpToMax) {
  Backoff backoff({.initial = milliseconds(100), .max = milliseconds(500), .jitter = 0});
  std::vector<nanoseconds> waits;
  for (int i = 0; i < 5; ++i) waits.push_back(backoff.Next());
  EXPECT_EQ(waits,
            (std::vector<nanoseconds>{milliseconds(100), milliseconds(200), milliseconds(400),
                                      milliseconds(500), milliseconds(500)}));
}

TEST(BackoffTest, ResetStartsAgainAtInitial) {
  Backoff backoff({.initial = milliseconds(100), .max = seconds(5), .jitter = 0});
  backoff.Next();
  backoff.Next();
  EXPECT_EQ(backoff.nominal(), milliseconds(400));
  backoff.Reset();
  EXPECT_EQ(backoff.Next(), milliseconds(100));
}

TEST(BackoffTest, JitterStaysWithinItsBandAndVaries) {
  Backoff backoff({.initial = seconds(1), .max = seconds(1), .jitter = 0.2}, /*seed=*/7);
  std::set<int64_t> distinct;
  for (int i = 0; i < 200; ++i) {
    const nanoseconds wait = backoff.Next();
    EXPECT_GE(wait, milliseconds(800));
    EXPECT_LE(wait, milliseconds(1200));
    distinct.insert(wait.count());
  }
  // Clients that failed together must not come back together.
  EXPECT_GT(distinct.size(), 100u);
}

TEST(BackoffTest, TwoClientsWithDifferentSeedsWaitDifferently) {
  Backoff a(BackoffPolicy{}, 1), b(BackoffPolicy{}, 2);
  EXPECT_NE(a.Next(), b.Next());
}

TEST(BackoffTest, NextBeforeGivesUpWhenTheWaitWouldPassTheDeadline) {
  Backoff backoff({.initial = milliseconds(100), .max = seconds(5), .jitter = 0});
  const Backoff::Clock::time_point now{};
  const Backoff::Clock::time_point deadline = now + milliseconds(350);
  EXPECT_EQ(backoff.NextBefore(deadline, now), milliseconds(100));
  EXPECT_EQ(backoff.NextBefore(deadline, now + milliseconds(100)), milliseconds(200));
  // 300 ms + 400 ms is past 350 ms.
  EXPECT_EQ(backoff.NextBefore(deadline, now + milliseconds(300)), std::nullopt);
}

TEST(BackoffTest, NoDeadlineNeverGivesUp) {
  Backoff backoff({.initial = seconds(1), .max = seconds(60)});
  for (int i = 0; i < 100; ++i) {
    EXPECT_TRUE(backoff.NextBefore(Backoff::Clock::time_point::max()).has_value());
  }
}

}  // namespace
}  // namespace gradhub
