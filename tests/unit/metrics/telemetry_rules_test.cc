// TrainingMetrics' rules one by one (telemetry_rules.h): the refusal memory, rule 2 for a new
// job, rule 3 (attempts) and the sweep's rule per job, rule 4 and the trainer's drops per rank.
#include "services/metrics/telemetry_rules.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

namespace gradhub::metrics {
namespace {

const absl::Time kNow = absl::FromUnixSeconds(1700000000);

TEST(RefusalCacheTest, ARefusalLastsItsTtl) {
  RefusalCache refused(absl::Seconds(30));
  refused.Refuse("a", DropReason::kUnknownJob, kNow);
  EXPECT_EQ(refused.Find("a", kNow + absl::Seconds(29)), DropReason::kUnknownJob);
  EXPECT_EQ(refused.Find("a", kNow + absl::Seconds(30)), std::nullopt);
  EXPECT_EQ(refused.Find("b", kNow), std::nullopt);
}

TEST(RefusalCacheTest, PruneForgetsOnlyExpiredRefusals) {
  RefusalCache refused(absl::Seconds(30));
  refused.Refuse("old", DropReason::kFinishedJob, kNow);
  refused.Refuse("new", DropReason::kJobLimit, kNow + absl::Seconds(20));
  refused.Prune(kNow + absl::Seconds(30));
  EXPECT_EQ(refused.size(), 1u);
  EXPECT_EQ(refused.Find("new", kNow + absl::Seconds(30)), DropReason::kJobLimit);
}

TEST(RefusalCacheTest, AFloodOfIdsIsBounded) {
  RefusalCache refused(absl::Seconds(30));
  for (size_t i = 0; i < RefusalCache::kMaxRefusals + 5; ++i) {
    refused.Refuse(std::to_string(i), DropReason::kUnknownJob, kNow);
  }
  EXPECT_LE(refused.size(), RefusalCache::kMaxRefusals);
  EXPECT_EQ(refused.Find(std::to_string(RefusalCache::kMaxRefusals + 4), kNow),
            DropReason::kUnknownJob);  // the latest is kept
}

TEST(RefuseNewJobTest, EndedJobsAndJobsPastTheLimitGetNoSeries) {
  EXPECT_EQ(RefuseNewJob({1, 2, /*terminal=*/true}, 0, 10), DropReason::kFinishedJob);
  EXPECT_EQ(RefuseNewJob({1, 2, false}, 10, 10), DropReason::kJobLimit);
  EXPECT_EQ(RefuseNewJob({1, 2, true}, 10, 10), DropReason::kFinishedJob);  // the first reason
  EXPECT_EQ(RefuseNewJob({1, 2, false}, 9, 10), std::nullopt);
}

TEST(JobStateTest, OnlyTheCurrentAttemptCountsAndANewerOneAsksTheDirectory) {
  JobState job(kNow);
  job.Admit({2, 4, false});
  EXPECT_EQ(job.CheckAttempt(2, false), JobState::AttemptCheck::kCurrent);
  EXPECT_EQ(job.CheckAttempt(1, false), JobState::AttemptCheck::kStale);
  EXPECT_EQ(job.CheckAttempt(3, false), JobState::AttemptCheck::kAskDirectory);
  EXPECT_EQ(job.CheckAttempt(3, true), JobState::AttemptCheck::kStale);  // it does not know it
  job.Admit({1, 4, false});  // an older answer does not take the attempt back
  EXPECT_EQ(job.CheckAttempt(2, true), JobState::AttemptCheck::kCurrent);
}

TEST(JobStateTest, RanksMustBeBelowTheWorldSize) {
  JobState job(kNow);
  EXPECT_FALSE(job.InWorld(0));  // nothing known yet
  job.Admit({1, 2, false});
  EXPECT_TRUE(job.InWorld(1));
  EXPECT_FALSE(job.InWorld(2));
}

TEST(JobStateTest, AnEndedJobExpiresAfterTheFinishedTtlFromWhenTheSweepSawItEnd) {
  JobState job(kNow);
  const absl::Duration finished = absl::Minutes(1), idle = absl::Hours(1);
  job.Sweep({1, 2, /*terminal=*/true}, kNow + absl::Seconds(5));
  job.Sweep({1, 2, true}, kNow + absl::Seconds(50));  // still ended: the end stays at +5s
  EXPECT_FALSE(job.Expired(kNow + absl::Seconds(64), finished, idle));
  EXPECT_TRUE(job.Expired(kNow + absl::Seconds(65), finished, idle));
}

TEST(JobStateTest, ASilentJobExpiresAfterTheIdleTtl) {
  JobState job(kNow);
  const absl::Duration finished = absl::Minutes(1), idle = absl::Minutes(10);
  job.Reported(kNow + absl::Minutes(5));
  EXPECT_FALSE(job.Expired(kNow + absl::Minutes(14), finished, idle));
  EXPECT_TRUE(job.Expired(kNow + absl::Minutes(15), finished, idle));
}

TEST(RankProgressTest, StepsNotAboveTheLastAcceptedAreDuplicates) {
  RankProgress rank;
  rank.StartBatch(1);
  EXPECT_TRUE(rank.Accept(0));
  EXPECT_TRUE(rank.Accept(5));
  EXPECT_FALSE(rank.Accept(5));
  EXPECT_FALSE(rank.Accept(3));
  rank.StartBatch(1);  // the same attempt keeps its last step
  EXPECT_FALSE(rank.Accept(5));
  EXPECT_TRUE(rank.Accept(6));
}

TEST(RankProgressTest, ANewAttemptStartsOver) {
  RankProgress rank;
  rank.StartBatch(1);
  EXPECT_TRUE(rank.Accept(100));
  EXPECT_EQ(rank.NewTrainerDrops(5), 5);
  rank.StartBatch(2);
  EXPECT_TRUE(rank.Accept(50));
  EXPECT_EQ(rank.NewTrainerDrops(2), 2);  // the new reporter counts from 0
}

TEST(RankProgressTest, TrainerDropsComeFromTheCumulativeCountOnce) {
  RankProgress rank;
  rank.StartBatch(1);
  EXPECT_EQ(rank.NewTrainerDrops(5), 5);
  EXPECT_EQ(rank.NewTrainerDrops(5), 0);  // a resent batch
  EXPECT_EQ(rank.NewTrainerDrops(3), 0);  // an older batch
  EXPECT_EQ(rank.NewTrainerDrops(7), 2);
}

TEST(DropReasonTest, EveryReasonHasItsOwnLabel) {
  std::set<std::string> labels;
  for (int reason = 0; reason < kDropReasons; ++reason) {
    labels.insert(DropReasonLabel(static_cast<DropReason>(reason)));
  }
  EXPECT_EQ(labels.size(), static_cast<size_t>(kDropReasons));
  EXPECT_STREQ(DropReasonLabel(DropReason::kTrainerQueueFull), "trainer_queue_full");
}

}  // namespace
}  // namespace gradhub::metrics
