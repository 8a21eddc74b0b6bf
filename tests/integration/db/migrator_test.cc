#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "services/common/db/error.h"
#include "tests/integration/db/db_test_util.h"

namespace gradhub::db {
namespace {

using MigratorTest = DatabaseTest;

int64_t CountRows(Connection& connection, const std::string& sql) {
  auto result = connection.Exec(sql);
  EXPECT_TRUE(result.ok()) << result.status();
  return result.ok() ? result->row(0).Get<int64_t>("n") : -1;
}

int64_t UserTables(Connection& connection) {
  return CountRows(connection, "SELECT count(*) AS n FROM pg_tables WHERE schemaname = 'public'");
}

TEST_F(MigratorTest, AppliesFromEmptyThenIsANoOp) {
  auto connection = Connect();
  Migrator migrator;
  auto first = migrator.Apply(*connection);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->applied.size(), BuiltinMigrations().size());
  EXPECT_EQ(first->current_version, BuiltinMigrations().back().version);
  const int64_t tables = UserTables(*connection);
  EXPECT_GE(tables, 10);  // the tables of 0001 plus schema_migrations
  EXPECT_TRUE(migrator.CheckUpToDate(*connection).ok());

  auto second = migrator.Apply(*connection);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_TRUE(second->applied.empty());
  EXPECT_EQ(UserTables(*connection), tables);
  EXPECT_EQ(CountRows(*connection, "SELECT count(*) AS n FROM schema_migrations"),
            static_cast<int64_t>(BuiltinMigrations().size()));
}

TEST_F(MigratorTest, ConcurrentMigratorsLeaveOneConsistentSchema) {
  constexpr int kMigrators = 6;
  std::vector<absl::StatusOr<MigrationReport>> reports(kMigrators, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int i = 0; i < kMigrators; ++i) {
    threads.emplace_back([&, i] {
      ConnectionOptions options;
      options.url = url_;
      auto connection = Connection::Open(options);
      if (!connection.ok()) {
        reports[i] = connection.status();
        return;
      }
      reports[i] = Migrator().Apply(**connection);
    });
  }
  for (auto& thread : threads) thread.join();
  size_t applied_in_total = 0;
  for (const auto& report : reports) {
    ASSERT_TRUE(report.ok()) << report.status();
    applied_in_total += report->applied.size();
  }
  // Every migration was applied by exactly one of them.
  EXPECT_EQ(applied_in_total, BuiltinMigrations().size());
  auto connection = Connect();
  EXPECT_EQ(CountRows(*connection, "SELECT count(*) AS n FROM schema_migrations"),
            static_cast<int64_t>(BuiltinMigrations().size()));
  EXPECT_TRUE(Migrator().CheckUpToDate(*connection).ok());
}

TEST_F(MigratorTest, FailingMigrationLeavesNothingBehind) {
  auto connection = Connect();
  std::vector<Migration> migrations = BuiltinMigrations();
  migrations.push_back({9001, "broken", "CREATE TABLE half_done (x int); SELECT 1/0;"});
  auto report = Migrator(migrations).Apply(*connection);
  ASSERT_FALSE(report.ok());
  EXPECT_NE(report.status().message().find("9001_broken"), std::string::npos) << report.status();
  EXPECT_EQ(
      CountRows(*connection, "SELECT count(*) AS n FROM pg_tables WHERE tablename = 'half_done'"),
      0);
  EXPECT_EQ(
      CountRows(*connection, "SELECT count(*) AS n FROM schema_migrations WHERE version = 9001"),
      0);
  // The good ones before it did land, and the schema reports what is missing.
  EXPECT_TRUE(Migrator().CheckUpToDate(*connection).ok());
  EXPECT_EQ(Migrator(migrations).CheckUpToDate(*connection).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(MigratorTest, RefusesAnEditedMigration) {
  auto connection = Connect();
  ASSERT_TRUE(Migrator().Apply(*connection).ok());
  std::vector<Migration> edited = BuiltinMigrations();
  edited.front().sql += "\n-- a harmless-looking edit\n";
  auto report = Migrator(edited).Apply(*connection);
  EXPECT_EQ(report.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(report.status().message().find("0001_initial"), std::string::npos);
}

TEST_F(MigratorTest, RefusesADatabaseFromANewerBinary) {
  auto connection = Connect();
  std::vector<Migration> newer = BuiltinMigrations();
  newer.push_back({9002, "from_the_future", "CREATE TABLE future (x int);"});
  ASSERT_TRUE(Migrator(newer).Apply(*connection).ok());
  auto report = Migrator().Apply(*connection);
  EXPECT_EQ(report.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(report.status().message().find("9002_from_the_future"), std::string::npos);
}

TEST_F(MigratorTest, RefusesDuplicateVersions) {
  auto connection = Connect();
  std::vector<Migration> migrations = {{1, "a", "SELECT 1"}, {1, "b", "SELECT 2"}};
  EXPECT_EQ(Migrator(migrations).Apply(*connection).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace gradhub::db
