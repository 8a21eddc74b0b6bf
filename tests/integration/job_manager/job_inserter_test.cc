// JobInserter's group commit against a real PostgreSQL: concurrent creates share statements yet
// each caller gets its own job, one refused row fails alone, and a request_id repeated inside
// one batch still makes one job. A table lock held by the test stands in for a slow commit, so
// that requests queue behind a batch in flight exactly as they do under load.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <set>
#include <thread>
#include <vector>

#include "services/api/job_inserter.h"
#include "tests/integration/db/db_test_util.h"

namespace gradhub::api {
namespace {

class JobInserterTest : public db::DatabaseTest {
 protected:
  void SetUp() override {
    db::DatabaseTest::SetUp();
    Migrate();
    pool_ = MakePool(8);
    auto tenant = pool_->Exec("INSERT INTO tenants (name) VALUES ('tenant-a') RETURNING id");
    ASSERT_TRUE(tenant.ok()) << tenant.status();
    tenant_ = tenant->row(0).Get<int64_t>("id");
  }

  NewJob Job(const std::string& name, const std::string& request_id = "") const {
    NewJob job;
    job.tenant_id = tenant_;
    job.request_id = request_id;
    job.display_name = name;
    job.spec.set_display_name(name);
    (*job.spec.mutable_labels())["n"] = name;
    job.spec_json = "{\"displayName\": \"" + name + "\", \"labels\": {\"n\": \"" + name + "\"}}";
    job.world_size = 1;
    return job;
  }

  // Holds a lock that makes every INSERT INTO jobs wait until Release.
  class JobsTableLock {
   public:
    explicit JobsTableLock(db::Pool& pool) : lease_(*pool.Acquire()) {
      EXPECT_TRUE(lease_->Exec("BEGIN").ok());
      EXPECT_TRUE(lease_->Exec("LOCK TABLE jobs IN SHARE MODE").ok());
    }
    void Release() { EXPECT_TRUE(lease_->Exec("COMMIT").ok()); }

   private:
    db::Pool::Lease lease_;
  };

  static void WaitUntil(const std::function<bool()>& condition) {
    for (int i = 0; i < 500 && !condition(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ASSERT_TRUE(condition());
  }

  // Inserts `first` while a table lock makes its batch wait, queues `queued` behind it one by
  // one (so in this order), then releases the lock. Returns first's result, then queued's.
  std::vector<absl::StatusOr<v1::Job>> InsertBehindOneBatch(JobInserter& inserter, NewJob first,
                                                            std::vector<NewJob> queued) {
    JobsTableLock lock(*pool_);
    std::vector<absl::StatusOr<v1::Job>> results(queued.size() + 1, absl::UnknownError("not run"));
    std::vector<std::thread> threads;
    threads.emplace_back([&] { results[0] = inserter.Insert(first); });
    WaitUntil([&] { return inserter.stats().batches == 1; });
    for (size_t i = 0; i < queued.size(); ++i) {
      threads.emplace_back([&, i] { results[i + 1] = inserter.Insert(queued[i]); });
      WaitUntil([&] { return inserter.stats().queued == static_cast<int64_t>(i + 1); });
    }
    lock.Release();
    for (auto& thread : threads) thread.join();
    return results;
  }

  int64_t Count(const std::string& sql) {
    auto result = pool_->Exec(sql);
    EXPECT_TRUE(result.ok()) << result.status();
    return result.ok() ? result->row(0).Get<int64_t>("n") : -1;
  }

  std::unique_ptr<db::Pool> pool_;
  int64_t tenant_ = 0;
};

TEST_F(JobInserterTest, QueuedCreatesShareOneStatementAndEachGetsItsOwnJob) {
  JobInserter inserter(pool_.get(), {.max_batch = 32, .max_concurrent_batches = 1});
  // The first batch (one job) waits on the lock; the next 24 queue behind it, every other one
  // without a request_id: those rows have no key but their id.
  std::vector<NewJob> queued;
  for (int i = 1; i < 25; ++i) {
    queued.push_back(Job("job-" + std::to_string(i), i % 2 ? "" : "req-" + std::to_string(i)));
  }
  const auto results = InsertBehindOneBatch(inserter, Job("job-0", "req-0"), queued);

  std::set<std::string> names;
  for (int i = 0; i < 25; ++i) {
    ASSERT_TRUE(results[i].ok()) << i << ": " << results[i].status();
    EXPECT_EQ(results[i]->spec().display_name(), "job-" + std::to_string(i));
    // The row returned under this job's name is the row this request wrote.
    auto stored = pool_->Exec(
        "SELECT spec ->> 'displayName' AS name, labels ->> 'n' AS n"
        " FROM jobs WHERE 'jobs/' || id::text = $1",
        {results[i]->name()});
    ASSERT_TRUE(stored.ok() && !stored->empty()) << stored.status();
    EXPECT_EQ(stored->row(0).Get<std::string>("name"), "job-" + std::to_string(i));
    EXPECT_EQ(stored->row(0).Get<std::string>("n"), "job-" + std::to_string(i));
    EXPECT_EQ(results[i]->state(), v1::Job::PENDING);
    names.insert(results[i]->name());
  }
  EXPECT_EQ(names.size(), 25u);
  EXPECT_EQ(inserter.stats().batches, 2);
  EXPECT_EQ(inserter.stats().rows, 25);
  EXPECT_EQ(Count("SELECT count(*) AS n FROM jobs"), 25);
  EXPECT_EQ(Count("SELECT count(*) AS n FROM job_events WHERE type = 'STATE_CHANGED'"
                  " AND to_state = 'PENDING' AND attempt = 0"),
            25);
}

TEST_F(JobInserterTest, ARefusedRowFailsAloneAndTheRestOfItsBatchIsWritten) {
  JobInserter inserter(pool_.get(), {.max_batch = 32, .max_concurrent_batches = 1});
  std::vector<NewJob> queued;
  for (int i = 1; i < 11; ++i) queued.push_back(Job("job-" + std::to_string(i)));
  queued[4].tenant_id = tenant_ + 1000;  // no such tenant: a foreign key violation
  const auto results = InsertBehindOneBatch(inserter, Job("first"), queued);

  for (int i = 0; i < 11; ++i) {
    if (i == 5) {
      EXPECT_EQ(results[i].status().code(), absl::StatusCode::kFailedPrecondition)
          << results[i].status();
    } else {
      ASSERT_TRUE(results[i].ok()) << i << ": " << results[i].status();
    }
  }
  EXPECT_EQ(inserter.stats().batches, 2);
  EXPECT_EQ(Count("SELECT count(*) AS n FROM jobs"), 10);
  EXPECT_EQ(Count("SELECT count(*) AS n FROM job_events"), 10);
}

TEST_F(JobInserterTest, ARequestIdRepeatedInsideOneBatchMakesOneJob) {
  JobInserter inserter(pool_.get(), {.max_batch = 32, .max_concurrent_batches = 1});
  // The batch meets the same request_id six times, then with another spec.
  std::vector<NewJob> queued(6, Job("retried", "same"));
  queued.push_back(Job("changed", "same"));
  const auto results = InsertBehindOneBatch(inserter, Job("first"), queued);

  ASSERT_TRUE(results[1].ok()) << results[1].status();
  for (int i = 1; i < 7; ++i) {
    ASSERT_TRUE(results[i].ok()) << i << ": " << results[i].status();
    EXPECT_EQ(results[i]->name(), results[1]->name());
  }
  EXPECT_EQ(results[7].status().code(), absl::StatusCode::kAlreadyExists) << results[7].status();
  EXPECT_THAT(results[7].status().message(), ::testing::HasSubstr(results[1]->name()));
  EXPECT_EQ(inserter.stats().batches, 2);
  EXPECT_EQ(Count("SELECT count(*) AS n FROM jobs WHERE request_id = 'same'"), 1);
}

}  // namespace
}  // namespace gradhub::api
