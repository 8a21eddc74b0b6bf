// The leader lease (services/api/leader_lease.h) against a real PostgreSQL: each protocol step
// and failure case as a test, replicas played by LeaderLease objects on one database, ticked
// by hand. Leases are short (a few hundred milliseconds) so that expiry is quick to reach;
// sleeps are always longer than the rule needs, never tighter.
#include "services/api/leader_lease.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <future>
#include <thread>

#include "absl/time/clock.h"
#include "tests/integration/db/db_test_util.h"

namespace gradhub::api {
namespace {

using ::testing::HasSubstr;

constexpr absl::Duration kLease = absl::Milliseconds(400);

class LeaderLeaseTest : public db::DatabaseTest {
 protected:
  void SetUp() override {
    db::DatabaseTest::SetUp();
    Migrate();
    pool_ = MakePool(8);
  }

  std::unique_ptr<LeaderLease> Replica(const std::string& holder,
                                       std::function<void(bool)> on_change = {}) {
    return std::make_unique<LeaderLease>(
        pool_.get(), LeaderLeaseOptions{.holder = holder, .lease = kLease, .on_change = on_change});
  }

  // A write of the leader's work, fenced by `term` of `lease`, in one transaction.
  absl::Status FencedWrite(const LeaderLease& lease, int64_t term, const std::string& what) {
    return pool_->Transact([&](db::Transaction& tx) -> absl::Status {
      if (absl::Status fenced = lease.Fence(tx, term); !fenced.ok()) return fenced;
      return tx.Exec("INSERT INTO tenants (name) VALUES ($1)", {what}).status();
    });
  }

  bool Written(const std::string& what) {
    auto rows = pool_->Exec("SELECT 1 FROM tenants WHERE name = $1", {what});
    EXPECT_TRUE(rows.ok()) << rows.status();
    return rows.ok() && !rows->empty();
  }

  std::unique_ptr<db::Pool> pool_;
};

TEST(LeaderLeaseRules, LocalExpiryComesBeforeTheDatabasesExpiry) {
  const auto sent = std::chrono::steady_clock::now();
  // The database counts its lease from a moment after `sent`.
  EXPECT_LT(LocalTermExpiry(sent, kLease), sent + absl::ToChronoNanoseconds(kLease));
  EXPECT_GT(LocalTermExpiry(sent, kLease), sent);
}

TEST(LeaderLeaseRules, ReplicaIdentitiesDiffer) {
  EXPECT_NE(NewReplicaIdentity(), NewReplicaIdentity());
}

// Step 1: the first replica to tick takes the first term; the others see who leads.
TEST_F(LeaderLeaseTest, TheFirstReplicaTakesTheTermTheOthersSeeIt) {
  auto a = Replica("a"), b = Replica("b");
  ASSERT_TRUE(a->Tick().ok());
  ASSERT_TRUE(b->Tick().ok());
  ASSERT_TRUE(a->Current().has_value());
  EXPECT_EQ(a->Current()->number, 1);
  EXPECT_FALSE(b->Current().has_value());
  EXPECT_EQ(b->leader().holder, "a");
  EXPECT_EQ(b->leader().term, 1);
}

// Step 2: renewals keep the term (and its start) as long as they come in time.
TEST_F(LeaderLeaseTest, RenewalsInTimeKeepTheSameTerm) {
  auto a = Replica("a"), b = Replica("b");
  ASSERT_TRUE(a->Tick().ok());
  const LeaderTerm first = *a->Current();
  for (int i = 0; i < 6; ++i) {
    absl::SleepFor(kLease / 4);
    ASSERT_TRUE(a->Tick().ok());
    ASSERT_TRUE(b->Tick().ok());
  }
  ASSERT_TRUE(a->Current().has_value());
  EXPECT_EQ(a->Current()->number, first.number);
  EXPECT_EQ(a->Current()->began, first.began);
  EXPECT_FALSE(b->Current().has_value());
}

// Steps 1 and 3, the leader killed: a standby takes over only once the term has expired, and
// the old leader's own clock has ended its term before that.
TEST_F(LeaderLeaseTest, AStandbyTakesOverOnlyAfterTheTermExpires) {
  auto a = Replica("a"), b = Replica("b");
  ASSERT_TRUE(a->Tick().ok());
  absl::SleepFor(kLease / 2);
  ASSERT_TRUE(b->Tick().ok());
  EXPECT_FALSE(b->Current().has_value()) << "took over an unexpired term";
  absl::SleepFor(kLease);  // a is "dead": no more ticks
  EXPECT_FALSE(a->Current().has_value()) << "a still believes it leads";
  ASSERT_TRUE(b->Tick().ok());
  ASSERT_TRUE(b->Current().has_value());
  EXPECT_EQ(b->Current()->number, 2);
}

// Step 4: a deposed leader's transaction fails its fence and writes nothing.
TEST_F(LeaderLeaseTest, ADeposedLeadersFencedWriteFails) {
  auto a = Replica("a"), b = Replica("b");
  ASSERT_TRUE(a->Tick().ok());
  const int64_t term = a->Current()->number;
  EXPECT_TRUE(FencedWrite(*a, term, "while-leading").ok());
  absl::SleepFor(kLease * 3 / 2);  // paused
  ASSERT_TRUE(b->Tick().ok());
  ASSERT_TRUE(b->Current().has_value());
  const absl::Status late = FencedWrite(*a, term, "after-takeover");
  EXPECT_EQ(late.code(), absl::StatusCode::kFailedPrecondition) << late;
  EXPECT_THAT(std::string(late.message()), HasSubstr("not the leader"));
  EXPECT_TRUE(Written("while-leading"));
  EXPECT_FALSE(Written("after-takeover"));
  // Expired without a takeover fails too: the database's clock decides, not the holder's.
  absl::SleepFor(kLease * 3 / 2);
  EXPECT_FALSE(FencedWrite(*b, b->Current() ? b->Current()->number : 2, "expired").ok());
}

// Step 4: a takeover waits for the fenced transaction in flight, which commits inside the old
// term; nothing it wrote lands after the new term began.
TEST_F(LeaderLeaseTest, ATakeoverWaitsForTheOldTermsTransaction) {
  auto a = Replica("a"), b = Replica("b");
  ASSERT_TRUE(a->Tick().ok());
  const int64_t term = a->Current()->number;
  std::promise<void> fenced;
  std::thread leader([&] {
    absl::Status status = pool_->Transact([&](db::Transaction& tx) -> absl::Status {
      if (absl::Status ok = a->Fence(tx, term); !ok.ok()) return ok;
      fenced.set_value();
      // Busy (not idle: step 5 would end it) past the term's expiry.
      if (absl::Status ok = tx.Exec("SELECT pg_sleep(0.8)").status(); !ok.ok()) return ok;
      return tx.Exec("INSERT INTO tenants (name) VALUES ('slow-write')").status();
    });
    EXPECT_TRUE(status.ok()) << status;
  });
  fenced.get_future().wait();
  absl::SleepFor(kLease * 5 / 4);  // the term expires while the transaction runs
  EXPECT_FALSE(b->Tick().ok()) << "took the lock held by the old term's transaction";
  EXPECT_FALSE(b->Current().has_value());
  leader.join();
  ASSERT_TRUE(b->Tick().ok());
  ASSERT_TRUE(b->Current().has_value());
  EXPECT_TRUE(Written("slow-write"));  // committed in the old term, before the takeover
}

// Step 5: a fenced transaction left idle (its leader frozen) is ended by PostgreSQL after a
// lease, so the frozen leader blocks no takeover for long, and its writes roll back.
TEST_F(LeaderLeaseTest, AFrozenLeadersOpenTransactionIsEndedByTheDatabase) {
  auto a = Replica("a"), b = Replica("b");
  ASSERT_TRUE(a->Tick().ok());
  const int64_t term = a->Current()->number;
  const absl::Status status = pool_->Transact([&](db::Transaction& tx) -> absl::Status {
    if (absl::Status ok = a->Fence(tx, term); !ok.ok()) return ok;
    if (absl::Status ok = tx.Exec("INSERT INTO tenants (name) VALUES ('frozen')").status();
        !ok.ok()) {
      return ok;
    }
    absl::SleepFor(kLease * 3);  // frozen, idle in the transaction
    return tx.Exec("SELECT 1").status();
  });
  EXPECT_FALSE(status.ok());
  EXPECT_FALSE(Written("frozen"));
  ASSERT_TRUE(b->Tick().ok());
  EXPECT_TRUE(b->Current().has_value());
}

// Steps 2-3, a pause: the leader's term is over by its own clock when it wakes, and its next
// tick starts a new term (with a new start) rather than renewing the old one.
TEST_F(LeaderLeaseTest, APausedLeaderWakesWithoutItsTermAndStartsANewOne) {
  std::vector<bool> changes;
  auto a = Replica("a", [&](bool leading) { changes.push_back(leading); });
  ASSERT_TRUE(a->Tick().ok());
  const LeaderTerm first = *a->Current();
  absl::SleepFor(kLease * 3 / 2);
  EXPECT_FALSE(a->Current().has_value());
  ASSERT_TRUE(a->Tick().ok());
  ASSERT_TRUE(a->Current().has_value());
  EXPECT_EQ(a->Current()->number, first.number + 1);
  EXPECT_GT(a->Current()->began, first.began);
  EXPECT_EQ(changes, (std::vector<bool>{true, false, true}));
}

// Step 3 with the database gone: the leader stops acting by its own clock, without any answer.
TEST_F(LeaderLeaseTest, ALeaderWhoseRenewalsFailStepsDownBeforeItsLeaseEnds) {
  auto a = Replica("a");
  ASSERT_TRUE(a->Tick().ok());
  ASSERT_TRUE(
      pool_->Exec("ALTER TABLE control_plane_leader RENAME TO control_plane_leader_away").ok());
  const absl::Time start = absl::Now();
  while (a->Current().has_value() && absl::Now() - start < kLease * 2) {
    EXPECT_FALSE(a->Tick().ok());
    absl::SleepFor(kLease / 8);
  }
  EXPECT_FALSE(a->Current().has_value());
  EXPECT_LT(absl::Now() - start, kLease) << "stepped down only after the lease";
  ASSERT_TRUE(
      pool_->Exec("ALTER TABLE control_plane_leader_away RENAME TO control_plane_leader").ok());
}

// Step 6: Stop releases the term, and a standby takes over at its next tick.
TEST_F(LeaderLeaseTest, StopReleasesTheTermAtOnce) {
  auto a = Replica("a"), b = Replica("b");
  a->Start();
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (!a->Current() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(10));
  ASSERT_TRUE(a->Current().has_value());
  a->Stop();
  EXPECT_FALSE(a->Current().has_value());
  ASSERT_TRUE(b->Tick().ok());
  EXPECT_TRUE(b->Current().has_value());
}

}  // namespace
}  // namespace gradhub::api
