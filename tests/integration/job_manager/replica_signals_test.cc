// ReplicaSignals between two "replicas" (two instances, each with its own pool) on one real
// PostgreSQL: what one publishes reaches the other's callbacks, and a lost listener
// connection makes a replica read everything again.
#include "services/api/replica_signals.h"

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "tests/support/postgres_server.h"

namespace gradhub::api {
namespace {

// What one replica's callbacks were called with.
struct Heard {
  std::mutex mu;
  std::condition_variable changed;
  int assignments = 0;
  int nudges = 0;
  std::vector<std::string> jobs;

  void Note(const std::function<void()>& change) {
    {
      std::lock_guard<std::mutex> lock(mu);
      change();
    }
    changed.notify_all();
  }
  // Waits up to 10 s for `done` (under the lock).
  bool WaitFor(const std::function<bool()>& done) {
    std::unique_lock<std::mutex> lock(mu);
    return changed.wait_for(lock, std::chrono::seconds(10), done);
  }
};

class ReplicaSignalsTest : public ::testing::Test {
 protected:
  void SetUp() override { url_ = testing::PostgresServer::Shared().CreateDatabase(); }

  db::Pool& NewPool() {
    db::PoolOptions pool;
    pool.connection.url = url_;
    pools_.push_back(std::make_unique<db::Pool>(pool));
    return *pools_.back();
  }

  // A replica: its pool and its signals, reporting into `heard`.
  std::unique_ptr<ReplicaSignals> Replica(const std::string& name, Heard& heard) {
    db::Pool& pool = NewPool();
    ReplicaSignalsOptions options;
    options.connection.url = url_;
    options.connection.application_name = name;
    options.on_assignments_changed = [&heard] { heard.Note([&] { ++heard.assignments; }); };
    options.on_nudge = [&heard] { heard.Note([&] { ++heard.nudges; }); };
    options.on_job_created = [&heard](const std::string& job) {
      heard.Note([&] { heard.jobs.push_back(job); });
    };
    auto signals = std::make_unique<ReplicaSignals>(&pool, std::move(options));
    EXPECT_TRUE(signals->Start().ok());
    EXPECT_TRUE(signals->WaitUntilListening(absl::Now() + absl::Seconds(10)));
    return signals;
  }

  std::string url_;
  std::vector<std::unique_ptr<db::Pool>> pools_;
};

TEST_F(ReplicaSignalsTest, WhatOneReplicaPublishesReachesTheOther) {
  Heard heard_a, heard_b;
  auto a = Replica("replica_a", heard_a);
  auto b = Replica("replica_b", heard_b);
  const std::string job = "jobs/0b7e5c9a-3f43-4c2e-9b1d-5f0e8a7d6c21";
  a->PublishJobCreated(job);
  a->PublishAssignmentsChanged();
  a->PublishNudge();
  EXPECT_TRUE(heard_b.WaitFor([&] {
    return heard_b.jobs == std::vector<std::string>{job} && heard_b.assignments >= 1 &&
           heard_b.nudges >= 1;
  }));
  // The sender hears its own signals, but not its own jobs: its in-process call had them. (The
  // job was sent no later than the others, so it would have been heard by now.)
  EXPECT_TRUE(heard_a.WaitFor(
      [&] { return heard_a.assignments >= 1 && heard_a.nudges >= 1 && heard_a.jobs.empty(); }));
}

TEST_F(ReplicaSignalsTest, AJobCreatedThatIsNotAJobNameBecomesANudge) {
  Heard heard;
  auto replica = Replica("replica", heard);
  db::Pool& pool = NewPool();
  ASSERT_TRUE(db::Notify(pool, ReplicaChannels::kJobsCreated, "jobs/x'); DROP TABLE jobs").ok());
  EXPECT_TRUE(heard.WaitFor([&] { return heard.nudges >= 1; }));
  EXPECT_TRUE(heard.jobs.empty());
}

TEST_F(ReplicaSignalsTest, AReconnectedListenerReadsEverythingAgain) {
  Heard heard;
  auto replica = Replica("replica_killed", heard);
  db::Pool& pool = NewPool();
  auto killed = pool.Exec(
      "SELECT count(pg_terminate_backend(pid))::bigint AS n FROM pg_stat_activity"
      " WHERE application_name = 'replica_killed'");
  ASSERT_TRUE(killed.ok()) << killed.status();
  ASSERT_EQ(killed->row(0).Get<int64_t>("n"), 1);
  EXPECT_TRUE(heard.WaitFor([&] { return heard.assignments >= 1 && heard.nudges >= 1; }));
}

}  // namespace
}  // namespace gradhub::api
