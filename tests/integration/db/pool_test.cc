#include <atomic>
#include <chrono>
#include <cmath>
#include <iostream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "services/common/db/connection.h"
#include "services/common/db/error.h"
#include "services/common/status_macros.h"
#include "tests/integration/db/db_test_util.h"
#include "tests/support/packet_filter.h"

namespace gradhub::db {
namespace {

using PoolTest = DatabaseTest;

TEST_F(PoolTest, TypedValuesRoundTrip) {
  auto pool = MakePool();
  const std::string bytes("a\0b\xff", 4);
  auto result = pool->Exec(
      "SELECT $1::bigint AS big, $2::int AS small, $3::float8 AS real, $4::bool AS flag, "
      "$5::text AS missing, $6::bytea AS raw, $7::float8 AS nan",
      {int64_t{1} << 40, int32_t{-7}, 0.1, true, std::nullopt, Param::Bytes(bytes), std::nan("")});
  ASSERT_TRUE(result.ok()) << result.status();
  Row row = result->row(0);
  EXPECT_EQ(row.Get<int64_t>("big"), int64_t{1} << 40);
  EXPECT_EQ(row.Get<int32_t>("small"), -7);
  EXPECT_EQ(row.Get<double>("real"), 0.1);  // %.17g loses nothing
  EXPECT_TRUE(row.Get<bool>("flag"));
  EXPECT_EQ(row.Get<std::optional<std::string>>("missing"), std::nullopt);
  EXPECT_EQ(DecodeBytea(row.Get<std::string>("raw")), bytes);
  EXPECT_TRUE(std::isnan(row.Get<double>("nan")));
  EXPECT_THROW(row.Get<std::string>("missing"), std::logic_error);
  EXPECT_THROW(row.Get<int64_t>("no_such_column"), std::logic_error);
}

TEST_F(PoolTest, StatementsWithParametersArePreparedOncePerConnection) {
  ConnectionOptions options;
  options.url = url_;
  auto connection = Connection::Open(options);
  ASSERT_TRUE(connection.ok()) << connection.status();
  Connection& db = **connection;
  auto prepared = [&] {
    return db.Exec("SELECT count(*)::bigint AS n FROM pg_prepared_statements")
        ->row(0)
        .Get<int64_t>("n");
  };
  for (int i = 0; i < 3; ++i) {
    auto doubled = db.Exec("SELECT $1::int * 2 AS v", {i});
    ASSERT_TRUE(doubled.ok()) << doubled.status();
    EXPECT_EQ(doubled->row(0).Get<int32_t>("v"), 2 * i) << "the values of each call, not the first";
  }
  EXPECT_EQ(prepared(), 1);
  ASSERT_TRUE(db.Exec("BEGIN").ok());
  ASSERT_TRUE(db.Exec("COMMIT").ok());
  EXPECT_EQ(prepared(), 1) << "statements without parameters are not prepared";
  // A statement that fails to prepare is an error like any other, and nothing is cached.
  auto bad = db.Exec("SELECT $1::int FROM no_such_table", {1});
  EXPECT_EQ(SqlStateOf(bad.status()), "42P01");
  EXPECT_EQ(prepared(), 1);
  for (size_t i = 0; i < Connection::kMaxPreparedStatements + 10; ++i) {
    ASSERT_TRUE(db.Exec(absl::StrCat("SELECT $1::int + ", i, " AS v"), {1}).ok());
  }
  EXPECT_EQ(prepared(), static_cast<int64_t>(Connection::kMaxPreparedStatements))
      << "past the bound, statements run unprepared";
}

TEST_F(PoolTest, ErrorsCarryTheSqlStateAndKeepTheSqlForTheServer) {
  auto pool = MakePool();
  auto result = pool->Exec("SELECT * FROM no_such_table");
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(SqlStateOf(result.status()), "42P01");
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInternal);
  EXPECT_EQ(result.status().message().find("no_such_table"), std::string::npos) << result.status();
  EXPECT_NE(DetailsOf(result.status()).find("no_such_table"), std::string::npos);
}

// A client reads a database error's message (handlers pass it on): what it says must never be
// SQL, the driver's text or a value; the server keeps those (DetailsOf, its log).
void ExpectNothingOfTheDatabaseIn(const absl::Status& status) {
  for (const char* leak : {"SELECT", "INSERT", "secret_value", "kept_name", "pkey", "relation",
                           "division", "invalid input", "Key ("}) {
    EXPECT_EQ(status.message().find(leak), std::string::npos) << leak << " in " << status;
  }
}

TEST_F(PoolTest, ClientsReadAFixedSentencePerConditionNeverTheSql) {
  auto pool = MakePool();
  ASSERT_TRUE(pool->Exec("CREATE TABLE kept_name (name text PRIMARY KEY)").ok());
  ASSERT_TRUE(pool->Exec("INSERT INTO kept_name VALUES ($1)", {"secret_value"}).ok());
  // Conditions callers branch on keep their codes.
  auto taken = pool->Exec("INSERT INTO kept_name VALUES ($1)", {"secret_value"});
  EXPECT_EQ(taken.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(SqlStateOf(taken.status()), sqlstate::kUniqueViolation);
  ExpectNothingOfTheDatabaseIn(taken.status());
  EXPECT_NE(DetailsOf(taken.status()).find("kept_name_pkey"), std::string::npos);
  // Conditions nobody expects (bad data that validation should have refused, our own SQL) are
  // INTERNAL.
  for (const auto& [sql, value] : std::vector<std::pair<std::string, std::string>>{
           {"SELECT 1 / $1::int AS x", "0"},
           {"SELECT $1::uuid AS x", "secret_value"},
           {"SELECT (timestamptz 'epoch' + $1::bigint * interval '1 microsecond') AS x",
            "9223372036854775807"}}) {
    auto failed = pool->Exec(sql, {value});
    EXPECT_EQ(failed.status().code(), absl::StatusCode::kInternal) << sql;
    ExpectNothingOfTheDatabaseIn(failed.status());
    EXPECT_NE(DetailsOf(failed.status()).find("SELECT"), std::string::npos);
  }
}

TEST_F(PoolTest, ATextParameterWithANulIsRefusedNotCut) {
  auto pool = MakePool();
  ASSERT_TRUE(pool->Exec("CREATE TABLE ids (id text PRIMARY KEY)").ok());
  ASSERT_TRUE(pool->Exec("INSERT INTO ids VALUES ($1)", {"a"}).ok());
  // libpq would send "a" for "a\0b" and find the row of "a".
  auto found = pool->Exec("SELECT id FROM ids WHERE id = $1", {std::string("a\0b", 3)});
  ASSERT_FALSE(found.ok());
  EXPECT_EQ(found.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(found.status().message().find("NUL"), std::string::npos);
  ExpectNothingOfTheDatabaseIn(found.status());
  // Bytes may hold NUL: they travel as hex.
  EXPECT_TRUE(pool->Exec("SELECT $1::bytea AS b", {Param::Bytes(std::string("\0", 1))}).ok());
}

TEST_F(PoolTest, SurvivesAServerRestart) {
  if (testing::PostgresServer::Shared().external()) GTEST_SKIP() << "external server";
  auto pool = MakePool(2);
  ASSERT_TRUE(pool->Exec("CREATE TABLE kept (x int)").ok());
  ASSERT_TRUE(pool->Exec("INSERT INTO kept VALUES (42)").ok());
  testing::PostgresServer::Shared().Restart();
  // The pooled connection died with the old server; the pool notices and reconnects.
  auto result = pool->Exec("SELECT x FROM kept");
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->row(0).Get<int32_t>("x"), 42);
  // And a transaction after another restart, too.
  testing::PostgresServer::Shared().Restart();
  absl::Status status = pool->Transact(
      [](Transaction& tx) { return tx.Exec("INSERT INTO kept VALUES (43)").status(); });
  EXPECT_TRUE(status.ok()) << status;
}

TEST_F(PoolTest, UnreachableServerIsUnavailable) {
  PoolOptions options;
  options.connection.url = "postgresql://postgres@127.0.0.1:1/nowhere";
  options.connection.connect_timeout = absl::Seconds(1);
  Pool pool(options);
  auto lease = pool.Acquire();
  EXPECT_EQ(lease.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(pool.size(), 0);
}

TEST_F(PoolTest, AcquireIsBoundedByTheSizeLimit) {
  PoolOptions options;
  options.connection.url = url_;
  options.max_connections = 2;
  options.acquire_timeout = absl::Milliseconds(200);
  Pool pool(options);
  auto first = pool.Acquire();
  auto second = pool.Acquire();
  ASSERT_TRUE(first.ok() && second.ok());
  auto third = pool.Acquire();
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(pool.size(), 2);
  { Pool::Lease released = *std::move(first); }
  EXPECT_TRUE(pool.Acquire().ok());
}

TEST_F(PoolTest, FailedBodyRollsBack) {
  auto pool = MakePool();
  ASSERT_TRUE(pool->Exec("CREATE TABLE t (x int)").ok());
  absl::Status status = pool->Transact([](Transaction& tx) -> absl::Status {
    if (auto r = tx.Exec("INSERT INTO t VALUES (1)"); !r.ok()) return r.status();
    return absl::InvalidArgumentError("changed my mind");
  });
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(pool->Exec("SELECT count(*) AS n FROM t")->row(0).Get<int64_t>("n"), 0);
}

TEST_F(PoolTest, IgnoredStatementErrorIsNotACommit) {
  auto pool = MakePool();
  ASSERT_TRUE(pool->Exec("CREATE TABLE t (x int PRIMARY KEY)").ok());
  absl::Status status = pool->Transact([](Transaction& tx) {
    tx.Exec("INSERT INTO t VALUES (1)").IgnoreError();
    tx.Exec("INSERT INTO t VALUES (1)").IgnoreError();  // unique violation, ignored
    return absl::OkStatus();
  });
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal) << status;
  EXPECT_EQ(pool->Exec("SELECT count(*) AS n FROM t")->row(0).Get<int64_t>("n"), 0);
}

TEST_F(PoolTest, TransactReturnsValues) {
  auto pool = MakePool();
  absl::StatusOr<int64_t> value = pool->Transact([](Transaction& tx) -> absl::StatusOr<int64_t> {
    auto result = tx.Exec("SELECT 6 * 7 AS answer");
    if (!result.ok()) return result.status();
    return result->row(0).Get<int64_t>("answer");
  });
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, 42);
}

// Read-modify-write under SERIALIZABLE from many threads: conflicts abort some transactions
// with 40001 and Transact runs them again, so no increment is lost.
TEST_F(PoolTest, SerializationFailuresAreRetried) {
  auto pool = MakePool(8);
  ASSERT_TRUE(pool->Exec("CREATE TABLE counter (n int NOT NULL)").ok());
  ASSERT_TRUE(pool->Exec("INSERT INTO counter VALUES (0)").ok());
  constexpr int kThreads = 8, kIncrements = 10;
  std::atomic<int> bodies_run{0};
  std::vector<std::thread> threads;
  std::vector<absl::Status> failures(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      TransactionOptions options;
      options.isolation = Isolation::kSerializable;
      options.max_attempts = 100;
      for (int i = 0; i < kIncrements; ++i) {
        absl::Status status = pool->Transact(
            [&](Transaction& tx) -> absl::Status {
              ++bodies_run;
              auto read = tx.Exec("SELECT n FROM counter");
              if (!read.ok()) return read.status();
              int n = read->row(0).Get<int32_t>("n");
              return tx.Exec("UPDATE counter SET n = $1", {n + 1}).status();
            },
            options);
        if (!status.ok()) failures[t] = status;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (const auto& status : failures) EXPECT_TRUE(status.ok()) << status;
  EXPECT_EQ(pool->Exec("SELECT n FROM counter")->row(0).Get<int32_t>("n"), kThreads * kIncrements);
  EXPECT_GT(bodies_run.load(), kThreads * kIncrements) << "no conflict happened: test is weak";
}

// A database whose packets are dropped (issue 34): no reset ever comes, only silence. These
// cases drop the binary's own server's port, so they need it (not an external one) and nftables.
class SilentDatabaseTest : public DatabaseTest {
 protected:
  using Clock = std::chrono::steady_clock;

  void SetUp() override {
    std::string why;
    if (testing::PostgresServer::Shared().external()) GTEST_SKIP() << "needs our own PostgreSQL";
    if (!testing::PacketFilter::Available(&why)) GTEST_SKIP() << why;
    DatabaseTest::SetUp();
  }

  // Shorter timeouts than a server's defaults, for a quick test; the mechanisms are the same.
  std::unique_ptr<Pool> QuickPool(absl::Duration connect_timeout = absl::Seconds(1)) {
    PoolOptions options;
    options.connection.url = url_;
    options.connection.connect_timeout = connect_timeout;
    options.connection.silence_timeout = absl::Seconds(1);
    options.reconnect_interval = absl::Milliseconds(200);
    options.max_connections = 2;
    return std::make_unique<Pool>(options);
  }

  void Drop() { filter_.DropTcpPort(testing::PostgresServer::Shared().port()); }
  void Lift() { filter_.LiftAll(); }
  static double SecondsSince(Clock::time_point start) {
    return std::chrono::duration<double>(Clock::now() - start).count();
  }

  testing::PacketFilter filter_;
};

// Silence is found within the silence timeout, then every call fails at once, naming the
// outage, until the database answers again; the pool then recovers by itself.
TEST_F(SilentDatabaseTest, FailsAtOnceWhileUnreachableAndRecoversByItself) {
  auto pool = QuickPool();
  ASSERT_TRUE(pool->Exec("CREATE TABLE kept (x int)").ok());  // an idle connection
  const absl::Time before = absl::Now();
  Drop();
  auto start = Clock::now();
  auto first = pool->Exec("SELECT 1");
  const double first_took = SecondsSince(start);
  EXPECT_EQ(first.status().code(), absl::StatusCode::kUnavailable) << first.status();
  EXPECT_TRUE(IsSilence(first.status())) << first.status();
  EXPECT_LT(first_took, 2.5) << "silence_timeout is 1s";
  EXPECT_TRUE(pool->unreachable());
  EXPECT_GE(pool->last_unreachable(), before);

  start = Clock::now();
  auto again = pool->Exec("SELECT 1");
  absl::Status transaction = pool->Transact(
      [](Transaction& tx) { return tx.Exec("INSERT INTO kept VALUES (1)").status(); });
  auto within = pool->ExecWithin(absl::Seconds(5), "SELECT 1");
  EXPECT_LT(SecondsSince(start), 0.1) << "not at once";
  for (const absl::Status& status : {again.status(), transaction, within.status()}) {
    EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
    EXPECT_NE(status.message().find("the database has been unreachable for"), std::string::npos)
        << status;
  }

  Lift();
  start = Clock::now();
  while (pool->unreachable() && SecondsSince(start) < 5) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::cout << "[ measured ] first call failed after " << first_took << " s; reachable again "
            << SecondsSince(start) << " s after the drop was lifted" << std::endl;
  EXPECT_FALSE(pool->unreachable());
  auto after = pool->Exec("SELECT count(*)::bigint AS n FROM kept");
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->row(0).Get<int64_t>("n"), 0) << "the refused transaction wrote nothing";
}

// The same when the outage begins with no connection open: the first connect goes unanswered,
// and the pool knows at once, rather than every call spending its retries on connects. The
// kernel gives up on the SYNs at the silence timeout, before connect_timeout.
TEST_F(SilentDatabaseTest, AConnectIntoSilenceMarksTheDatabaseUnreachable) {
  auto pool = QuickPool(/*connect_timeout=*/absl::Seconds(5));
  Drop();
  const auto start = Clock::now();
  auto first = pool->Exec("SELECT 1");
  const double took = SecondsSince(start);
  EXPECT_EQ(first.status().code(), absl::StatusCode::kUnavailable) << first.status();
  EXPECT_TRUE(IsSilence(first.status())) << first.status();
  EXPECT_LT(took, 2.0) << "silence_timeout is 1s";
  EXPECT_TRUE(pool->unreachable());
  Lift();
  const auto lifted = Clock::now();
  while (pool->unreachable() && SecondsSince(lifted) < 5) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(pool->Exec("SELECT 1").ok());
}

// A health check's budget ends a statement that has no answer yet: DEADLINE_EXCEEDED, the
// connection abandoned (its answer may still come), and the database not declared unreachable
// for it: a slow database is not a silent one.
TEST_F(SilentDatabaseTest, ExecWithinAnswersByItsDeadline) {
  auto pool = QuickPool();
  ASSERT_TRUE(pool->Exec("SELECT 1").ok());
  ASSERT_EQ(pool->size(), 1);
  Drop();
  const auto start = Clock::now();
  auto checked = pool->ExecWithin(absl::Milliseconds(300), "SELECT 1");
  const double took = SecondsSince(start);
  EXPECT_EQ(checked.status().code(), absl::StatusCode::kDeadlineExceeded) << checked.status();
  EXPECT_GE(took, 0.29);
  EXPECT_LT(took, 0.6);
  EXPECT_FALSE(pool->unreachable());
  EXPECT_EQ(pool->size(), 0) << "the abandoned connection went back to the pool";
  Lift();
  EXPECT_TRUE(pool->ExecWithin(absl::Seconds(2), "SELECT 1").ok());
}

// A COMMIT sent into silence has an unknown outcome: UNAVAILABLE saying so, never OK. (Here
// it never arrived, so nothing was committed; the caller cannot know that.)
TEST_F(SilentDatabaseTest, ACommitWithoutAnAnswerIsAnErrorNeverASuccess) {
  auto pool = QuickPool();
  ASSERT_TRUE(pool->Exec("CREATE TABLE kept (x int)").ok());
  absl::Status status = pool->Transact([&](Transaction& tx) -> absl::Status {
    GRADHUB_RETURN_IF_ERROR(tx.Exec("INSERT INTO kept VALUES (1)").status());
    Drop();  // after the last statement, before COMMIT
    return absl::OkStatus();
  });
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_NE(status.message().find("may or may not have committed"), std::string::npos) << status;
  Lift();
  const auto start = Clock::now();
  absl::StatusOr<Result> rows;
  do {
    rows = pool->Exec("SELECT count(*)::bigint AS n FROM kept");
  } while (!rows.ok() && SecondsSince(start) < 5);
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_EQ(rows->row(0).Get<int64_t>("n"), 0);
}

// The server's end: a session cut off inside a transaction holds its locks (the scheduler's
// advisory lock, rows FOR UPDATE) until the server finds the client gone. Its keepalives,
// set per session, find that within the silence timeout, not TCP's two hours.
TEST_F(SilentDatabaseTest, TheServerEndsACutOffSessionAndReleasesItsLocks) {
  auto pool = QuickPool();
  {
    auto holder = pool->Acquire();
    ASSERT_TRUE(holder.ok()) << holder.status();
    ASSERT_TRUE((*holder)->Exec("BEGIN").ok());
    ASSERT_TRUE((*holder)->Exec("SELECT pg_advisory_xact_lock(34)").ok());
    Drop();
    // This end gives up on the connection (its reset is dropped too); the server is left with
    // a session inside a transaction that nothing will ever finish.
    EXPECT_TRUE(IsSilence((*holder)->Exec("SELECT 1").status()));
    std::this_thread::sleep_for(std::chrono::seconds(2));
    Lift();
  }  // released silent: closed without a word to the server, whose session is gone already
  auto other = Connect();
  ASSERT_NE(other, nullptr);
  ASSERT_TRUE(other->Exec("SET statement_timeout = 5000").ok());
  const auto start = Clock::now();
  auto locked = other->Exec("SELECT pg_advisory_lock(34)");
  EXPECT_TRUE(locked.ok()) << locked.status();
  EXPECT_LT(SecondsSince(start), 1.0);
}

}  // namespace
}  // namespace gradhub::db
