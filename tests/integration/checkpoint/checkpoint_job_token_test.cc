// Script ranks' job tokens against CheckpointManager and real PostgreSQL: each rule of
// checkpoint_access.h for Principal::Kind::kJob (own job and attempt only, no listing or
// deleting, another job NOT_FOUND, the token dead once its attempt or its job ended).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_replace.h"
#include "tests/integration/checkpoint/checkpoint_test_util.h"

namespace gradhub::checkpoint::testing {
namespace {

using ::testing::HasSubstr;

class CheckpointJobTokenTest : public CheckpointTest {
 protected:
  void SetUp() override {
    CheckpointTest::SetUp();
    job_ = InsertJob(*pool_, tenant_a_, "RUNNING", /*attempt=*/2);
    token_ = auth_->CreateJobToken(job_, 2, /*rank=*/0)->secret;
  }

  // The job token's caller: no node metadata, the token says it all.
  Caller Rank() { return As(token_); }

  std::string job_, token_;
};

TEST_F(CheckpointJobTokenTest, SavesForItsOwnAttemptAndReadsItsOwnJob) {
  const Caller rank = Rank();
  EXPECT_EQ(rank.principal.kind, api::Principal::Kind::kJob);
  EXPECT_EQ(CallerKey(rank), "job:" + job_);
  const std::string data = Blob(200000, 4);
  auto upload = Start(rank, job_, 2, 10, static_cast<int64_t>(data.size()));
  ASSERT_TRUE(upload.ok()) << upload.status();
  ASSERT_TRUE(Write(rank, *upload, data, 0, data.size()).ok());
  auto committed = Commit(rank, *upload, Sha256Hex(data));
  ASSERT_TRUE(committed.ok()) << committed.status();
  auto latest = manager_->GetLatest(rank, JobName(job_));
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(latest->step(), 10);
  auto read = ReadAll(rank, committed->name());
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_TRUE(*read == data);
}

TEST_F(CheckpointJobTokenTest, AnotherAttemptIsPermissionDenied) {
  for (int attempt : {1, 3}) {
    auto upload = Start(Rank(), job_, attempt, 10, 10);
    EXPECT_TRUE(absl::IsPermissionDenied(upload.status())) << attempt << ": " << upload.status();
    EXPECT_THAT(upload.status().message(), HasSubstr("attempt 2"));
  }
}

TEST_F(CheckpointJobTokenTest, AnotherJobIsNotFoundAsIfItDidNotExist) {
  const std::string sibling = InsertJob(*pool_, tenant_a_, "RUNNING", 2);  // same tenant
  const std::string foreign = InsertJob(*pool_, tenant_b_, "RUNNING", 2);
  const v1::Checkpoint saved = Save(sibling, 2, 10, Blob(10));
  const std::string missing = "00000000-0000-0000-0000-000000000000";
  auto absent = Start(Rank(), missing, 2, 10, 10);
  ASSERT_TRUE(absl::IsNotFound(absent.status())) << absent.status();
  for (const std::string& other : {sibling, foreign}) {
    auto upload = Start(Rank(), other, 2, 20, 10);
    EXPECT_TRUE(absl::IsNotFound(upload.status())) << upload.status();
    EXPECT_EQ(upload.status().message(),
              absl::StrReplaceAll(absent.status().message(), {{missing, other}}));
    EXPECT_TRUE(absl::IsNotFound(manager_->GetLatest(Rank(), JobName(other)).status()));
  }
  EXPECT_TRUE(absl::IsNotFound(ReadAll(Rank(), saved.name()).status()));
}

TEST_F(CheckpointJobTokenTest, ListingAndDeletingArePermissionDenied) {
  const v1::Checkpoint saved = Save(job_, 2, 10, Blob(10));
  v1::ListCheckpointsRequest list;
  list.set_parent(JobName(job_));
  EXPECT_TRUE(absl::IsPermissionDenied(manager_->List(Rank(), list).status()));
  EXPECT_TRUE(absl::IsPermissionDenied(manager_->Delete(Rank(), saved.name())));
  EXPECT_EQ(ListAll(Admin(), job_).size(), 1u);
}

TEST_F(CheckpointJobTokenTest, TheTokenStopsWithItsAttemptAndAnUploadInFlightCannotCommit) {
  const Caller rank = Rank();  // authenticated while attempt 2 runs
  const std::string data = Blob(1000);
  auto upload = Start(rank, job_, 2, 10, static_cast<int64_t>(data.size()));
  ASSERT_TRUE(upload.ok()) << upload.status();
  ASSERT_TRUE(Write(rank, *upload, data, 0, data.size()).ok());
  Restart(*pool_, job_);  // attempt 3
  EXPECT_TRUE(absl::IsUnauthenticated(auth_->Authenticate("Bearer " + token_).status()));
  // The caller of a request that began before: the usual current-attempt check.
  auto committed = Commit(rank, *upload, Sha256Hex(data));
  EXPECT_TRUE(absl::IsFailedPrecondition(committed.status())) << committed.status();
}

TEST_F(CheckpointJobTokenTest, TheTokenStopsWhenTheJobEnds) {
  ASSERT_TRUE(auth_->Authenticate("Bearer " + token_).ok());
  ASSERT_TRUE(pool_->Exec("UPDATE jobs SET state = 'SUCCEEDED' WHERE id = $1::uuid", {job_}).ok());
  EXPECT_TRUE(absl::IsUnauthenticated(auth_->Authenticate("Bearer " + token_).status()));
}

}  // namespace
}  // namespace gradhub::checkpoint::testing
