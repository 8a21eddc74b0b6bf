#include "gpu_worker/agent/reconcile.h"

#include <gtest/gtest.h>

namespace gradhub::agent {
namespace {

using Desired = google::protobuf::RepeatedPtrField<v1::RankAssignment>;

v1::RankAssignment Assignment(const std::string& job, int attempt, int rank) {
  v1::RankAssignment assignment;
  assignment.set_job(job);
  assignment.set_attempt(attempt);
  assignment.set_rank(rank);
  assignment.set_world_size(2);
  return assignment;
}

Desired DesiredSet(std::initializer_list<v1::RankAssignment> assignments) {
  Desired desired;
  for (const auto& assignment : assignments) *desired.Add() = assignment;
  return desired;
}

std::vector<RankKey> StartedKeys(const ReconcileActions& actions) {
  std::vector<RankKey> keys;
  for (const auto& assignment : actions.start) keys.push_back(KeyOf(assignment));
  return keys;
}

const RankKey kA0{"jobs/a", 1, 0};
const RankKey kA1{"jobs/a", 1, 1};

TEST(ReconcileTest, StartsADesiredRankNeverSeen) {
  const auto actions =
      Reconcile(DesiredSet({Assignment("jobs/a", 1, 0), Assignment("jobs/a", 1, 1)}), {}, {});
  EXPECT_EQ(StartedKeys(actions), (std::vector<RankKey>{kA0, kA1}));
  EXPECT_EQ(actions.start[0].world_size(), 2);  // the whole assignment is passed on
  EXPECT_TRUE(actions.stop.empty());
  EXPECT_TRUE(actions.drop.empty());
}

TEST(ReconcileTest, LeavesARunningDesiredRankAlone) {
  const auto actions = Reconcile(DesiredSet({Assignment("jobs/a", 1, 0)}), {{kA0, {}}}, {kA0});
  EXPECT_TRUE(actions.start.empty());
  EXPECT_TRUE(actions.stop.empty());
  EXPECT_TRUE(actions.drop.empty());
}

TEST(ReconcileTest, StartsARepeatedDesiredRankOnce) {
  const auto actions =
      Reconcile(DesiredSet({Assignment("jobs/a", 1, 0), Assignment("jobs/a", 1, 0)}), {}, {});
  EXPECT_EQ(StartedKeys(actions), std::vector<RankKey>{kA0});
}

TEST(ReconcileTest, StopsARunningRankThatIsNotDesired) {
  const auto actions =
      Reconcile(DesiredSet({Assignment("jobs/a", 1, 0)}), {{kA0, {}}, {kA1, {}}}, {kA0, kA1});
  EXPECT_EQ(actions.stop, std::vector<RankKey>{kA1});
  EXPECT_TRUE(actions.start.empty());
  EXPECT_TRUE(actions.drop.empty());
}

TEST(ReconcileTest, DoesNotStopTwice) {
  const auto actions = Reconcile({}, {{kA0, {false, true}}}, {kA0});
  EXPECT_TRUE(actions.stop.empty());
  EXPECT_TRUE(actions.drop.empty());  // still running: reported until it has exited
}

TEST(ReconcileTest, DropsAnExitedRankThatIsNotDesired) {
  const auto actions = Reconcile({}, {{kA0, {true, false}}, {kA1, {true, true}}}, {kA0, kA1});
  EXPECT_EQ(actions.drop, (std::vector<RankKey>{kA0, kA1}));
  EXPECT_TRUE(actions.stop.empty());
}

TEST(ReconcileTest, KeepsReportingAnExitedRankTheServerStillDesires) {
  const auto actions =
      Reconcile(DesiredSet({Assignment("jobs/a", 1, 0)}), {{kA0, {true, false}}}, {kA0});
  EXPECT_TRUE(actions.start.empty()) << "an exited key is never restarted";
  EXPECT_TRUE(actions.drop.empty()) << "its exit is reported until the server records it";
  EXPECT_TRUE(actions.stop.empty());
}

TEST(ReconcileTest, NeverRestartsADroppedKey) {
  // Dropped (no longer known) but seen: a late or repeated desired set must not revive it.
  const auto actions = Reconcile(DesiredSet({Assignment("jobs/a", 1, 0)}), {}, {kA0});
  EXPECT_TRUE(actions.start.empty());
}

TEST(ReconcileTest, ANewAttemptIsANewKey) {
  const auto actions =
      Reconcile(DesiredSet({Assignment("jobs/a", 2, 0)}), {{kA0, {true, false}}}, {kA0});
  EXPECT_EQ(StartedKeys(actions), (std::vector<RankKey>{{"jobs/a", 2, 0}}));
  EXPECT_EQ(actions.drop, std::vector<RankKey>{kA0});
}

TEST(ReconcileTest, AnEmptyDesiredSetStopsEverything) {
  const RankKey b{"jobs/b", 3, 0};
  const auto actions = Reconcile({}, {{kA0, {}}, {kA1, {}}, {b, {true, false}}}, {kA0, kA1, b});
  EXPECT_EQ(actions.stop, (std::vector<RankKey>{kA0, kA1}));
  EXPECT_EQ(actions.drop, std::vector<RankKey>{b});
  EXPECT_TRUE(actions.start.empty());
}

TEST(ReconcileTest, KeyToString) { EXPECT_EQ(kA1.ToString(), "jobs/a attempt 1 rank 1"); }

// Step 4a (nodes.proto): the ranks of a discarded attempt are SIGKILLed, not stopped.
const std::set<AttemptKey> kDiscardA1{{"jobs/a", 1}};

TEST(ReconcileTest, KillsARunningRankOfADiscardedAttemptInsteadOfStoppingIt) {
  const RankKey b{"jobs/b", 1, 0};
  const auto actions = Reconcile({}, {{kA0, {}}, {b, {}}}, {kA0, b}, kDiscardA1);
  EXPECT_EQ(actions.kill, std::vector<RankKey>{kA0});
  EXPECT_EQ(actions.stop, std::vector<RankKey>{b}) << "another attempt keeps the grace";
  EXPECT_TRUE(actions.drop.empty());
}

TEST(ReconcileTest, KillsARankWhoseGracefulStopIsUnderWay) {
  const auto actions = Reconcile({}, {{kA0, {false, true, false}}}, {kA0}, kDiscardA1);
  EXPECT_EQ(actions.kill, std::vector<RankKey>{kA0});
  EXPECT_TRUE(actions.stop.empty());
}

TEST(ReconcileTest, DoesNotKillTwice) {
  const auto actions = Reconcile({}, {{kA0, {false, true, true}}}, {kA0}, kDiscardA1);
  EXPECT_TRUE(actions.kill.empty());
  EXPECT_TRUE(actions.stop.empty());
  EXPECT_TRUE(actions.drop.empty());  // still running: reported until it has exited
}

TEST(ReconcileTest, DropsAnExitedRankOfADiscardedAttempt) {
  const auto actions = Reconcile({}, {{kA0, {true, true, true}}}, {kA0}, kDiscardA1);
  EXPECT_EQ(actions.drop, std::vector<RankKey>{kA0});
  EXPECT_TRUE(actions.kill.empty());
}

TEST(ReconcileTest, NeverKillsADesiredRank) {
  const auto actions =
      Reconcile(DesiredSet({Assignment("jobs/a", 1, 0)}), {{kA0, {}}}, {kA0}, kDiscardA1);
  EXPECT_TRUE(actions.kill.empty());
  EXPECT_TRUE(actions.stop.empty());
}

TEST(ReconcileTest, DiscardedAttemptsAreTheAnswersAttemptRefs) {
  google::protobuf::RepeatedPtrField<v1::AttemptRef> refs;
  refs.Add()->set_job("jobs/a");
  refs.Mutable(0)->set_attempt(1);
  *refs.Add() = refs.Get(0);  // repeated: one key
  refs.Add()->set_job("jobs/b");
  refs.Mutable(2)->set_attempt(3);
  EXPECT_EQ(DiscardedAttempts(refs), (std::set<AttemptKey>{{"jobs/a", 1}, {"jobs/b", 3}}));
}

}  // namespace
}  // namespace gradhub::agent

namespace gradhub::agent {
namespace {

// Outage step 2 (reconcile.h): ranks ride out an api outage up to the grace, not a lease.
TEST(OutageGraceTest, RanksKeepRunningUntilTheGraceHasPassed) {
  EXPECT_FALSE(OutageGraceExpired(absl::Seconds(3), absl::Seconds(60)));
  EXPECT_FALSE(OutageGraceExpired(absl::Seconds(60), absl::Seconds(60)));
  EXPECT_TRUE(OutageGraceExpired(absl::Seconds(61), absl::Seconds(60)));
}

}  // namespace
}  // namespace gradhub::agent
