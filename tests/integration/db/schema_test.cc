// The schema of migrations/0001 enforces the job lifecycle itself; these tests talk SQL to it
// directly, as a buggy writer would.
#include "services/common/db/error.h"
#include "tests/integration/db/db_test_util.h"

namespace gradhub::db {
namespace {

class SchemaTest : public DatabaseTest {
 protected:
  void SetUp() override {
    DatabaseTest::SetUp();
    Migrate();
    pool_ = MakePool();
    auto tenant = pool_->Exec("INSERT INTO tenants (name) VALUES ('vision') RETURNING id");
    ASSERT_TRUE(tenant.ok()) << tenant.status();
    tenant_id_ = tenant->row(0).Get<int64_t>("id");
  }

  std::string InsertJob(const std::string& display_name = "job") {
    auto job = pool_->Exec(
        "INSERT INTO jobs (tenant_id, display_name, spec, world_size) "
        "VALUES ($1, $2, '{}', 2) RETURNING id",
        {tenant_id_, display_name});
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? job->row(0).Get<std::string>("id") : "";
  }

  absl::Status SetState(const std::string& job, const std::string& state) {
    return pool_->Exec("UPDATE jobs SET state = $2 WHERE id = $1", {job, state}).status();
  }

  std::unique_ptr<Pool> pool_;
  int64_t tenant_id_ = 0;
};

TEST_F(SchemaTest, ParametersWithSqlMetacharactersAreStoredVerbatim) {
  const std::string hostile = "it's; a \"quote\" \\ and '); DROP TABLE jobs; --";
  const std::string job = InsertJob(hostile);
  auto spec = pool_->Exec(
      "UPDATE jobs SET spec = jsonb_build_object('displayName', $2::text) "
      "WHERE id = $1",
      {job, hostile});
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto row = pool_->Exec(
      "SELECT display_name, spec->>'displayName' AS from_spec FROM jobs "
      "WHERE id = $1",
      {job});
  ASSERT_TRUE(row.ok()) << row.status();
  ASSERT_EQ(row->rows(), 1);
  EXPECT_EQ(row->row(0).Get<std::string>("display_name"), hostile);
  EXPECT_EQ(row->row(0).Get<std::string>("from_spec"), hostile);
  auto still_there = pool_->Exec("SELECT count(*) AS n FROM jobs");
  ASSERT_TRUE(still_there.ok()) << still_there.status();
  EXPECT_EQ(still_there->row(0).Get<int64_t>("n"), 1);
}

TEST_F(SchemaTest, DatabaseRefusesAnInvalidState) {
  const std::string job = InsertJob();
  absl::Status status = SetState(job, "BOGUS");
  // A rule of the schema broken is a bug of ours (handlers refuse bad input by its field):
  // INTERNAL, as every condition no caller expects (db/error.h).
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal) << status;
  EXPECT_EQ(SqlStateOf(status), sqlstate::kCheckViolation);
  auto inserted = pool_->Exec(
      "INSERT INTO jobs (tenant_id, spec, world_size, state) VALUES ($1, '{}', 1, 'bogus')",
      {tenant_id_});
  EXPECT_EQ(SqlStateOf(inserted.status()), sqlstate::kCheckViolation);
}

TEST_F(SchemaTest, LifecycleTransitionsAreEnforced) {
  const std::string job = InsertJob();
  // A skipped step is refused, and nothing changes.
  absl::Status skip = SetState(job, "RUNNING");
  EXPECT_EQ(skip.code(), absl::StatusCode::kFailedPrecondition) << skip;
  EXPECT_EQ(SqlStateOf(skip), sqlstate::kIllegalTransition);

  for (const char* state :
       {"SCHEDULED", "RUNNING", "RESTARTING", "SCHEDULED", "RUNNING", "SUCCEEDED"}) {
    ASSERT_TRUE(SetState(job, state).ok()) << state;
  }
  auto times = pool_->Exec(
      "SELECT start_time IS NOT NULL AS started, end_time IS NOT NULL AS ended, version "
      "FROM jobs WHERE id = $1",
      {job});
  ASSERT_TRUE(times.ok()) << times.status();
  EXPECT_TRUE(times->row(0).Get<bool>("started"));
  EXPECT_TRUE(times->row(0).Get<bool>("ended"));
  EXPECT_EQ(times->row(0).Get<int64_t>("version"), 7);

  // Terminal states are final.
  for (const char* state : {"RUNNING", "PENDING", "CANCELLED", "FAILED"}) {
    EXPECT_EQ(SqlStateOf(SetState(job, state)), sqlstate::kIllegalTransition) << state;
  }
}

TEST_F(SchemaTest, RequestIdMakesOneJobPerTenant) {
  const char* kInsert =
      "INSERT INTO jobs (tenant_id, request_id, spec, world_size) VALUES ($1, $2, '{}', 1)";
  ASSERT_TRUE(pool_->Exec(kInsert, {tenant_id_, "req-1"}).ok());
  auto again = pool_->Exec(kInsert, {tenant_id_, "req-1"});
  EXPECT_EQ(again.status().code(), absl::StatusCode::kAlreadyExists) << again.status();
  EXPECT_EQ(SqlStateOf(again.status()), sqlstate::kUniqueViolation);
}

TEST_F(SchemaTest, ASlotHoldsOneActiveRank) {
  const std::string job = InsertJob();
  auto node = pool_->Exec("INSERT INTO nodes (name, slots) VALUES ('node-a', 2) RETURNING id");
  ASSERT_TRUE(node.ok()) << node.status();
  const int64_t node_id = node->row(0).Get<int64_t>("id");
  ASSERT_TRUE(pool_
                  ->Exec("INSERT INTO job_attempts (job_id, attempt, rendezvous_prefix) "
                         "VALUES ($1, 1, $2)",
                         {job, job + "/attempts/1"})
                  .ok());
  const char* kAssign =
      "INSERT INTO rank_assignments (job_id, attempt, rank, node_id, local_rank, slot) "
      "VALUES ($1, 1, $2, $3, $2, $4)";
  ASSERT_TRUE(pool_->Exec(kAssign, {job, 0, node_id, 0}).ok());
  auto double_booked = pool_->Exec(kAssign, {job, 1, node_id, 0});
  EXPECT_EQ(SqlStateOf(double_booked.status()), sqlstate::kUniqueViolation);
  // Once the first rank stopped, its slot is free again.
  ASSERT_TRUE(pool_->Exec("UPDATE rank_assignments SET state = 'STOPPED' WHERE rank = 0").ok());
  EXPECT_TRUE(pool_->Exec(kAssign, {job, 1, node_id, 0}).ok());
}

}  // namespace
}  // namespace gradhub::db
