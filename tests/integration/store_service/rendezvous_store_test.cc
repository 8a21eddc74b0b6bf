// RendezvousStore over both backends: the conformance suite (rendezvous_store_conformance.h) in
// memory and in a real PostgreSQL, then what only a shared backend has: two stores on one
// database standing for two api replicas, the attempt-end cleanup, and the cost of a rendezvous.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "services/api/postgres_rendezvous_backend.h"
#include "services/api/rendezvous_store.h"
#include "services/common/db/migrator.h"
#include "services/common/db/pool.h"
#include "tests/integration/store_service/rendezvous_store_conformance.h"
#include "tests/support/postgres_server.h"

namespace gradhub::api {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

// A fresh, migrated database; its URL.
std::string MigratedDatabase() {
  const std::string url = testing::PostgresServer::Shared().CreateDatabase();
  db::ConnectionOptions options;
  options.url = url;
  absl::StatusOr<std::string> migrated = db::Migrator().ApplyWith(options);
  EXPECT_TRUE(migrated.ok()) << migrated.status();
  return url;
}

std::unique_ptr<db::Pool> PoolFor(const std::string& url) {
  db::PoolOptions options;
  options.connection.url = url;
  options.max_connections = 8;
  return std::make_unique<db::Pool>(options);
}

// A store as one api replica has it: its own pool on the shared database. The store goes
// before the pool it reads through.
std::shared_ptr<RendezvousStore> Replica(const std::string& url,
                                         RendezvousStoreOptions options = {}) {
  std::shared_ptr<db::Pool> pool = PoolFor(url);
  auto* store = new RendezvousStore(std::move(options),
                                    std::make_unique<PostgresRendezvousBackend>(pool.get()));
  return std::shared_ptr<RendezvousStore>(store, [pool](RendezvousStore* s) { delete s; });
}

INSTANTIATE_TEST_SUITE_P(
    Backends, RendezvousStoreConformanceTest,
    ::testing::Values(RendezvousStoreFactory{"InMemory",
                                             [](RendezvousStoreOptions options) {
                                               return std::make_shared<RendezvousStore>(
                                                   std::move(options));
                                             }},
                      RendezvousStoreFactory{"Postgres",
                                             [](RendezvousStoreOptions options) {
                                               return Replica(MigratedDatabase(),
                                                              std::move(options));
                                             }}),
    RendezvousStoreFactoryName);

constexpr char kPrefix[] = "jobs/j1/attempts/1/";
std::string Key(const std::string& name) { return kPrefix + name; }

class TwoReplicasTest : public ::testing::Test {
 protected:
  void SetUp() override { url_ = MigratedDatabase(); }
  std::string url_;
};

TEST_F(TwoReplicasTest, AWaitOnOneCompletesWhenTheOtherSetsTheKeyThroughThePoll) {
  auto a = Replica(url_);
  auto b = Replica(url_);
  Outcome waiting;
  const Clock::time_point start = Clock::now();
  a->Wait({Key("x"), Key("y")}, absl::Seconds(10), waiting.OnWait());
  ASSERT_TRUE(b->Set(Key("x"), "1").ok());
  ASSERT_TRUE(a->Set(Key("y"), "2").ok());
  Outcome value;
  a->Get(Key("z"), absl::Seconds(10), value.OnGet());
  ASSERT_TRUE(b->Set(Key("z"), "from b").ok());
  ASSERT_TRUE(waiting.Await());
  ASSERT_TRUE(value.Await());
  const auto elapsed = std::chrono::duration_cast<milliseconds>(Clock::now() - start);
  EXPECT_TRUE(waiting.result().ok()) << waiting.result().status();
  EXPECT_EQ(value.result().value(), "from b");
  EXPECT_LT(elapsed, milliseconds(1000)) << "the poll runs every 50 ms";
  EXPECT_EQ(a->pending_waiters(), 0u);
}

TEST_F(TwoReplicasTest, KeysChangedCompletesAtOnceWithoutThePoll) {
  RendezvousStoreOptions no_poll;
  no_poll.poll_interval = absl::Hours(1);
  auto a = Replica(url_, no_poll);
  auto b = Replica(url_);
  Outcome waiting;
  a->Get(Key("x"), absl::Seconds(10), waiting.OnGet());
  ASSERT_TRUE(b->Set(Key("x"), "v").ok());
  a->KeyChanged(Key("other"));  // Nobody misses it: no read.
  std::this_thread::sleep_for(milliseconds(100));
  EXPECT_EQ(waiting.calls(), 0) << "neither a poll nor a notification should have come";
  a->KeyChanged(Key("x"));
  ASSERT_TRUE(waiting.Await(milliseconds(2000)));
  EXPECT_EQ(waiting.result().value(), "v");

  Outcome again;
  a->Wait({Key("y")}, absl::Seconds(10), again.OnWait());
  ASSERT_TRUE(b->Set(Key("y"), "v").ok());
  a->KeysChanged();
  ASSERT_TRUE(again.Await(milliseconds(2000)));
  EXPECT_TRUE(again.result().ok()) << again.result().status();
}

TEST_F(TwoReplicasTest, AddIsAtomicAcrossReplicas) {
  constexpr int kAddsEach = 100;
  auto a = Replica(url_);
  auto b = Replica(url_);
  std::vector<std::thread> threads;
  for (RendezvousStore* store : {a.get(), a.get(), b.get(), b.get()}) {
    threads.emplace_back([store] {
      for (int i = 0; i < kAddsEach; ++i) EXPECT_TRUE(store->Add(Key("count"), 1).ok());
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(a->Add(Key("count"), 0).value(), 4 * kAddsEach);
  EXPECT_EQ(b->Add(Key("count"), 0).value(), 4 * kAddsEach);
}

TEST_F(TwoReplicasTest, AKeyOutlivesTheReplicaThatSetIt) {
  auto a = Replica(url_);
  ASSERT_TRUE(a->Set(Key("addr"), "10.0.0.1:29500").ok());
  ASSERT_TRUE(a->Add(Key("arrived"), 3).ok());
  Outcome cut_off;
  a->Get(Key("never"), absl::Seconds(10), cut_off.OnGet());
  a.reset();  // The replica dies; its waiter goes with it.
  EXPECT_EQ(cut_off.result().status().code(), absl::StatusCode::kUnavailable);

  auto b = Replica(url_);
  Outcome addr;
  EXPECT_EQ(b->Get(Key("addr"), absl::Seconds(1), addr.OnGet()), RendezvousStore::kNoWaiter);
  EXPECT_EQ(addr.result().value(), "10.0.0.1:29500");
  EXPECT_EQ(b->Add(Key("arrived"), 1).value(), 4);
}

TEST_F(TwoReplicasTest, DatabaseErrorsAreUnavailableWithTheCause) {
  auto pool = PoolFor("postgresql://postgres@127.0.0.1:1/none?connect_timeout=1");
  RendezvousStore store({}, std::make_unique<PostgresRendezvousBackend>(pool.get()));
  for (const absl::Status& status :
       {store.Set(Key("k"), "v"), store.Add(Key("k"), 1).status(), store.Check({Key("k")}).status(),
        store.DeletePrefix(kPrefix).status()}) {
    EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
    EXPECT_NE(status.message().find("the rendezvous store's database: "), std::string::npos)
        << status;
  }
  Outcome waiting;  // Pending despite the failed read: the poll tries again until the deadline.
  store.Get(Key("k"), absl::Milliseconds(200), waiting.OnGet());
  ASSERT_TRUE(waiting.Await());
  EXPECT_EQ(waiting.result().status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(waiting.result().status().message().find("the last read of the store failed"),
            std::string::npos)
      << waiting.result().status();
}

// migrations/0017: an attempt's keys go in the transaction that ends it, and with its row.
TEST_F(TwoReplicasTest, AnAttemptsKeysAreDeletedWhenItEnds) {
  auto pool = PoolFor(url_);
  auto exec = [&](const std::string& sql) {
    absl::StatusOr<db::Result> result = pool->Exec(sql);
    EXPECT_TRUE(result.ok()) << sql << ": " << result.status();
    return result;
  };
  auto run = [&](const std::string& sql) { exec(sql).IgnoreError(); };
  run("INSERT INTO tenants (name) VALUES ('t')");
  const std::string job = exec(
                              "INSERT INTO jobs (tenant_id, spec, world_size, state)"
                              " SELECT id, '{}', 1, 'SCHEDULED' FROM tenants RETURNING id::text")
                              ->row(0)
                              .Get<std::string>("id");
  const std::string attempt = "jobs/" + job + "/attempts/";
  for (int n : {1, 10}) {
    run("INSERT INTO job_attempts (job_id, attempt, rendezvous_prefix) VALUES ('" + job + "', " +
        std::to_string(n) + ", '" + attempt + std::to_string(n) + "/')");
  }
  auto store = Replica(url_);
  for (const char* key : {"1/a", "1/b", "10/a"}) ASSERT_TRUE(store->Set(attempt + key, "v").ok());
  run("UPDATE job_attempts SET state = 'RUNNING' WHERE attempt = 1");
  EXPECT_TRUE(store->Check({attempt + "1/a"}).value()) << "still running";
  run("UPDATE job_attempts SET state = 'FAILED', end_time = now() WHERE attempt = 1");
  EXPECT_FALSE(store->Check({attempt + "1/a"}).value());
  EXPECT_FALSE(store->Check({attempt + "1/b"}).value());
  EXPECT_TRUE(store->Check({attempt + "10/a"}).value()) << "attempt 10 is not attempt 1";
  run("DELETE FROM jobs");  // Retention: the attempts go with the job, their keys with them.
  EXPECT_EQ(store->size(), 0u);
}

// World-8 rendezvous as trainers do it: each rank Sets its address, then Waits for all 8.
// Prints the time per rendezvous in memory and in PostgreSQL (the cost rendezvous_store.h
// states).
double RendezvousMillis(RendezvousStore& store, int rounds) {
  constexpr int kWorld = 8;
  const Clock::time_point start = Clock::now();
  for (int round = 0; round < rounds; ++round) {
    const std::string prefix = "jobs/bench/attempts/" + std::to_string(round + 1) + "/";
    std::vector<std::string> keys;
    for (int rank = 0; rank < kWorld; ++rank)
      keys.push_back(prefix + "rank" + std::to_string(rank));
    std::vector<std::unique_ptr<Outcome>> waits;
    std::vector<std::thread> ranks;
    for (int rank = 0; rank < kWorld; ++rank) waits.push_back(std::make_unique<Outcome>());
    for (int rank = 0; rank < kWorld; ++rank) {
      ranks.emplace_back([&, rank] {
        EXPECT_TRUE(store.Set(keys[rank], "10.0.0.1:2950" + std::to_string(rank)).ok());
        store.Wait(keys, absl::Seconds(10), waits[rank]->OnWait());
        EXPECT_TRUE(waits[rank]->Await());
      });
    }
    for (std::thread& rank : ranks) rank.join();
  }
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count() / rounds;
}

TEST_F(TwoReplicasTest, RendezvousCost) {
  constexpr int kRounds = 50;
  RendezvousStore in_memory;
  auto postgres = Replica(url_);
  RendezvousMillis(*postgres, 5);  // Warm the pool's connections and prepared statements.
  const double memory_ms = RendezvousMillis(in_memory, kRounds);
  const double postgres_ms = RendezvousMillis(*postgres, kRounds);
  // One rank's Set on its own: the round trip a store call costs.
  auto set_micros = [](RendezvousStore& store) {
    constexpr int kSets = 500;
    const Clock::time_point start = Clock::now();
    for (int i = 0; i < kSets; ++i) EXPECT_TRUE(store.Set(Key("s"), std::to_string(i)).ok());
    return std::chrono::duration<double, std::micro>(Clock::now() - start).count() / kSets;
  };
  std::printf("one Set: in-memory %.1f us, PostgreSQL %.1f us\n", set_micros(in_memory),
              set_micros(*postgres));
  std::printf(
      "world-8 rendezvous (8 x (Set + Wait on 8 keys)), mean of %d: in-memory %.3f ms,"
      " PostgreSQL %.3f ms\n",
      kRounds, memory_ms, postgres_ms);
  RecordProperty("in_memory_ms", std::to_string(memory_ms));
  RecordProperty("postgres_ms", std::to_string(postgres_ms));
}

}  // namespace
}  // namespace gradhub::api
