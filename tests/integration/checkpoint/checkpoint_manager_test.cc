// CheckpointManager against a real PostgreSQL and a LocalBlobStore in a temp dir: the upload
// protocol, who may do what, retention, corruption found by downloads and by the scrub, and the
// cleanup after a crash. The gRPC and REST adapters have tests of their own.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "tests/integration/checkpoint/checkpoint_test_util.h"

namespace gradhub::checkpoint::testing {
namespace {

using ::testing::HasSubstr;

class CheckpointManagerTest : public CheckpointTest {
 protected:
  std::vector<v1::JobEvent::Type> Events(const std::string& job_id) {
    auto rows =
        pool_->Exec("SELECT type FROM job_events WHERE job_id = $1::uuid ORDER BY id", {job_id});
    std::vector<v1::JobEvent::Type> types;
    for (const db::Row& row : *rows) {
      v1::JobEvent::Type type = v1::JobEvent::TYPE_UNSPECIFIED;
      v1::JobEvent::Type_Parse(row.Get<std::string>("type"), &type);
      types.push_back(type);
    }
    return types;
  }
};

TEST_F(CheckpointManagerTest, UploadsInChunksCommitsAndServesIt) {
  const std::string job = InsertJob(*pool_, tenant_a_);
  const std::string data = Blob(300000);
  auto upload = Start(Admin(), job, 1, 100, static_cast<int64_t>(data.size()));
  ASSERT_TRUE(upload.ok()) << upload.status();
  EXPECT_EQ(*Write(Admin(), *upload, data, 0, 100000), 100000);
  EXPECT_EQ(*Write(Admin(), *upload, data, 100000, data.size()), 300000);
  // Listed while uploading, as UPLOADING; nothing to resume from yet.
  ASSERT_EQ(ListAll(Admin(), job).size(), 1u);
  EXPECT_EQ(ListAll(Admin(), job)[0].state(), v1::Checkpoint::UPLOADING);
  EXPECT_TRUE(absl::IsNotFound(manager_->GetLatest(Admin(), JobName(job)).status()));

  auto committed = Commit(Admin(), *upload, Sha256Hex(data));
  ASSERT_TRUE(committed.ok()) << committed.status();
  EXPECT_EQ(committed->name(), JobName(job) + "/checkpoints/100");
  EXPECT_EQ(committed->state(), v1::Checkpoint::COMMITTED);
  EXPECT_EQ(committed->size_bytes(), 300000);
  EXPECT_EQ(committed->sha256(), Sha256Hex(data));
  EXPECT_EQ(committed->metadata().at("format"), "test");
  EXPECT_TRUE(committed->has_commit_time());
  auto latest = manager_->GetLatest(Admin(), JobName(job));
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(latest->name(), committed->name());
  EXPECT_EQ(*ReadAll(Admin(), committed->name()), data);
  EXPECT_EQ(*ReadAll(Admin(), committed->name(), 123456), data.substr(123456));
  EXPECT_EQ(Events(job), std::vector<v1::JobEvent::Type>{v1::JobEvent::CHECKPOINT_COMMITTED});
  auto event =
      pool_->Exec("SELECT attempt, message FROM job_events WHERE job_id = $1::uuid", {job});
  EXPECT_EQ(event->row(0).Get<int32_t>("attempt"), 1);
  EXPECT_THAT(event->row(0).Get<std::string>("message"), HasSubstr("step 100"));
  EXPECT_THAT(event->row(0).Get<std::string>("message"), HasSubstr("300000 bytes"));
}

TEST_F(CheckpointManagerTest, AfterAChunkFailsAStreamWritesNothingMore) {
  const std::string job = InsertJob(*pool_, tenant_a_);
  const std::string data = Blob(1000);
  auto upload = Start(Admin(), job, 1, 1, 1000);
  ASSERT_EQ(*Write(Admin(), *upload, data, 0, 400), 400);
  auto writer = manager_->OpenUpload(Admin(), *upload);
  ASSERT_TRUE(writer.ok());
  EXPECT_TRUE((*writer)->Write(500, "x", Crc32c("x")).ok());  // queued; fails on the writer
  const absl::Status later = (*writer)->Write(400, data.substr(400, 100), std::nullopt);
  EXPECT_TRUE(later.ok() || absl::IsOutOfRange(later)) << later;  // the first error, once seen
  EXPECT_TRUE(absl::IsOutOfRange((*writer)->Finish().status()));
  EXPECT_TRUE(absl::IsOutOfRange((*writer)->Write(400, data.substr(400, 100), std::nullopt)));
  EXPECT_EQ(*WriteOne(Admin(), *upload, 0, ""), 400);  // the chunk behind the gap was dropped
}

TEST_F(CheckpointManagerTest, AGapIsOutOfRangeAndBytesBeyondTheSizeToo) {
  const std::string job = InsertJob(*pool_, tenant_a_);
  const std::string data = Blob(1000);
  auto upload = Start(Admin(), job, 1, 1, 1000);
  ASSERT_EQ(*Write(Admin(), *upload, data, 0, 400), 400);
  EXPECT_TRUE(absl::IsOutOfRange(WriteOne(Admin(), *upload, 500, "x").status()));
  EXPECT_TRUE(absl::IsOutOfRange(WriteOne(Admin(), *upload, 999, "xy").status()));
  EXPECT_EQ(*WriteOne(Admin(), *upload, 0, ""), 400);  // the probe
  // Bytes sent again are ignored: the first copy is what the hash check sees.
  EXPECT_EQ(*WriteOne(Admin(), *upload, 300, data.substr(300, 200)), 500);
  EXPECT_EQ(*Write(Admin(), *upload, data, 500, 1000), 1000);
  EXPECT_TRUE(Commit(Admin(), *upload, Sha256Hex(data)).ok());
}

TEST_F(CheckpointManagerTest, AChunkWhoseCrc32cDiffersIsDataLossAndNothingOfItIsWritten) {
  const std::string job = InsertJob(*pool_, tenant_a_);
  const std::string data = Blob(1000);
  auto upload = Start(Admin(), job, 1, 1, 1000);
  ASSERT_EQ(*Write(Admin(), *upload, data, 0, 400), 400);
  const auto wrong = WriteOne(Admin(), *upload, 400, data.substr(400, 100), ChunkCrc::kWrong);
  EXPECT_TRUE(absl::IsDataLoss(wrong.status())) << wrong.status();
  EXPECT_THAT(wrong.status().message(), HasSubstr("send it again from offset 400"));
  EXPECT_EQ(*WriteOne(Admin(), *upload, 0, ""), 400);
  EXPECT_EQ(*blobs_->UploadedBytes(*upload), 400);
  // Sent again, the upload goes on and commits without hashing anything here.
  EXPECT_EQ(*Write(Admin(), *upload, data, 400, 1000), 1000);
  auto committed = Commit(Admin(), *upload, Sha256Hex(data));
  ASSERT_TRUE(committed.ok()) << committed.status();
  EXPECT_EQ(*ReadAll(Admin(), committed->name()), data);
}

TEST_F(CheckpointManagerTest, WithEveryCrc32cCheckedAWrongSha256IsFoundWhenADownloadAsksForIt) {
  // The store hashes what it receives, so a commit claiming another sha256 is refused now,
  // every chunk's crc32c checked or not.
  const std::string job = InsertJob(*pool_, tenant_a_, "RUNNING", 1, 5);
  const std::string refused_data = Blob(5000, 9);
  auto upload = Start(Admin(), job, 1, 90, 5000);
  ASSERT_TRUE(Write(Admin(), *upload, refused_data, 0, 5000).ok());
  const auto refused = Commit(Admin(), *upload, Sha256Hex(refused_data + "x"));
  EXPECT_TRUE(absl::IsDataLoss(refused.status())) << refused.status();
  EXPECT_THAT(refused.status().message(), HasSubstr("does not match the bytes received"));
  // A row an older store wrote that way (it recorded the client's sha256 as it was) serves its
  // bytes, since downloads check the crc32c. The client's own check fails; it asks again with
  // verify_sha256, which marks the checkpoint BAD, and resume takes the one before.
  const v1::Checkpoint before = Save(job, 1, 10, Blob(3000, 1));
  auto claim_wrongly = [&](int64_t step) {
    const std::string data = Blob(5000, static_cast<int>(step));
    const v1::Checkpoint claimed = Save(job, 1, step, data);
    EXPECT_TRUE(pool_
                    ->Exec("UPDATE checkpoints SET sha256 = decode($3, 'hex')"
                           " WHERE job_id = $1::uuid AND step = $2",
                           {job, step, Sha256Hex(data + "x")})
                    .ok());
    EXPECT_EQ(*ReadAll(Admin(), claimed.name()), data);
    return claimed;
  };

  const v1::Checkpoint claimed = claim_wrongly(20);
  const absl::StatusOr<std::string> verified =
      ReadAll(Admin(), claimed.name(), 0, /*verify_sha256=*/true);
  EXPECT_TRUE(absl::IsDataLoss(verified.status())) << verified.status();
  EXPECT_THAT(verified.status().message(), HasSubstr("does not match its sha256"));
  EXPECT_EQ(manager_->GetLatest(Admin(), JobName(job))->name(), before.name());
  // The scrub, which hashes every blob, finds such a checkpoint too.
  claim_wrongly(30);
  auto scrubbed = manager_->Scrub();
  ASSERT_TRUE(scrubbed.ok()) << scrubbed.status();
  EXPECT_EQ(scrubbed->bad, 1);
  EXPECT_EQ(manager_->GetLatest(Admin(), JobName(job))->name(), before.name());
}

TEST_F(CheckpointManagerTest, TheCommitRecordsTheBlobsCrc32cWhetherTheChunksCarriedOneOrNot) {
  const std::string job = InsertJob(*pool_, tenant_a_, "RUNNING", 1, 5);
  auto recorded = [&](const v1::Checkpoint& checkpoint) {
    auto rows = pool_->Exec(
        "SELECT crc32c FROM checkpoints WHERE job_id = $1::uuid AND step = $2 AND "
        "state = 'COMMITTED'",
        {job, checkpoint.step()});
    EXPECT_TRUE(rows.ok() && rows->rows() == 1);
    return rows.ok() && !rows->row(0).IsNull("crc32c") ? rows->row(0).Get<int64_t>("crc32c") : -1;
  };
  // Every chunk with a crc32c: the running CRC of what was written.
  const std::string checked = Blob(200000, 1);
  EXPECT_EQ(recorded(Save(job, 1, 10, checked)), static_cast<int64_t>(Crc32c(checked)));
  // A chunk without one: the CRC the store took of it as it wrote it.
  const std::string read_back = Blob(200000, 2);
  auto upload = Start(Admin(), job, 1, 20, 200000);
  ASSERT_TRUE(Write(Admin(), *upload, read_back, 0, 100000).ok());
  ASSERT_TRUE(
      Write(Admin(), *upload, read_back, 100000, 200000, 64 << 10, ChunkCrc::kLeftOut).ok());
  auto committed = Commit(Admin(), *upload, Sha256Hex(read_back));
  ASSERT_TRUE(committed.ok()) << committed.status();
  EXPECT_EQ(recorded(*committed), static_cast<int64_t>(Crc32c(read_back)));
  // Chunks sent again after a broken stream count once.
  const std::string resent = Blob(300000, 3);
  upload = Start(Admin(), job, 1, 30, 300000);
  ASSERT_TRUE(Write(Admin(), *upload, resent, 0, 200000).ok());
  ASSERT_TRUE(Write(Admin(), *upload, resent, 150000, 300000).ok());
  committed = Commit(Admin(), *upload, Sha256Hex(resent));
  ASSERT_TRUE(committed.ok()) << committed.status();
  EXPECT_EQ(recorded(*committed), static_cast<int64_t>(Crc32c(resent)));
}

TEST_F(CheckpointManagerTest, ACheckpointCommittedWithoutACrc32cIsCheckedAgainstItsSha256) {
  // Committed before migration 0008 recorded crc32c.
  const std::string job = InsertJob(*pool_, tenant_a_);
  const std::string data = Blob(100000, 4);
  const v1::Checkpoint old = Save(job, 1, 10, data);
  ASSERT_TRUE(pool_->Exec("UPDATE checkpoints SET crc32c = NULL").ok());
  EXPECT_EQ(*ReadAll(Admin(), old.name()), data);
  FlipByte(BlobPathOf(old), 99999);
  const absl::StatusOr<std::string> flipped = ReadAll(Admin(), old.name());
  EXPECT_TRUE(absl::IsDataLoss(flipped.status())) << flipped.status();
  EXPECT_THAT(flipped.status().message(), HasSubstr("sha256"));
}

TEST_F(CheckpointManagerTest, WithoutCrc32cAWrongSha256IsDataLossAndDiscardsTheUpload) {
  // One chunk without crc32c (a client that predates the field): the store's own digests of
  // what it wrote decide.
  const std::string job = InsertJob(*pool_, tenant_a_);
  const std::string data = Blob(5000);
  auto upload = Start(Admin(), job, 1, 10, 5000);
  ASSERT_TRUE(Write(Admin(), *upload, data, 0, 4000).ok());
  ASSERT_TRUE(Write(Admin(), *upload, data, 4000, 5000, 64 << 10, ChunkCrc::kLeftOut).ok());
  EXPECT_TRUE(absl::IsInvalidArgument(Commit(Admin(), *upload, "not-a-sha").status()));
  EXPECT_TRUE(absl::IsInvalidArgument(
      Commit(Admin(), *upload, Sha256Hex(data).substr(0, 63) + "G").status()));
  auto wrong = Commit(Admin(), *upload, Sha256Hex(data + "x"));
  EXPECT_TRUE(absl::IsDataLoss(wrong.status())) << wrong.status();
  EXPECT_TRUE(ListAll(Admin(), job).empty());
  EXPECT_TRUE(absl::IsNotFound(Commit(Admin(), *upload, Sha256Hex(data)).status()));
  EXPECT_TRUE(absl::IsNotFound(manager_->OpenUpload(Admin(), *upload).status()));
  EXPECT_EQ(*blobs_->UploadedBytes(*upload), 0);
  EXPECT_TRUE(blobs_->ListBlobs()->empty());
}

TEST_F(CheckpointManagerTest, CommitNeedsEveryByteAndIsIdempotent) {
  const std::string job = InsertJob(*pool_, tenant_a_);
  const std::string data = Blob(2000);
  auto upload = Start(Admin(), job, 1, 20, 2000);
  ASSERT_TRUE(Write(Admin(), *upload, data, 0, 1500).ok());
  auto early = Commit(Admin(), *upload, Sha256Hex(data));
  EXPECT_TRUE(absl::IsFailedPrecondition(early.status())) << early.status();
  EXPECT_THAT(early.status().message(), HasSubstr("1500"));
  ASSERT_TRUE(Write(Admin(), *upload, data, 1500, 2000).ok());
  auto first = Commit(Admin(), *upload, Sha256Hex(data));
  ASSERT_TRUE(first.ok()) << first.status();
  auto again = Commit(Admin(), *upload, Sha256Hex(data));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->name(), first->name());
  EXPECT_EQ(again->commit_time().seconds(), first->commit_time().seconds());
  EXPECT_EQ(Events(job).size(), 1u);  // one commit, one event
  // A probe of a committed upload answers its size; more data is refused.
  EXPECT_EQ(*WriteOne(Admin(), *upload, 0, ""), 2000);
  EXPECT_TRUE(absl::IsFailedPrecondition(WriteOne(Admin(), *upload, 0, "x").status()));
}

TEST_F(CheckpointManagerTest, TheSameRequestIdGetsTheSameUpload) {
  const std::string job = InsertJob(*pool_, tenant_a_);
  auto first = Start(Admin(), job, 1, 30, 100, "save-30");
  auto retry = Start(Admin(), job, 1, 30, 100, "save-30");
  ASSERT_TRUE(first.ok() && retry.ok());
  EXPECT_EQ(*first, *retry);
  EXPECT_TRUE(absl::IsAlreadyExists(Start(Admin(), job, 1, 31, 100, "save-30").status()));
  EXPECT_NE(*Start(Admin(), job, 1, 30, 100), *first);  // no request_id: a new upload
  EXPECT_TRUE(
      absl::IsInvalidArgument(Start(Admin(), job, 1, 30, 100, std::string(65, 'r')).status()));
  // A step already committed takes no new upload.
  Save(job, 1, 40, Blob(10));
  EXPECT_TRUE(absl::IsAlreadyExists(Start(Admin(), job, 1, 40, 10).status()));
}

TEST_F(CheckpointManagerTest, InvalidStartsNameTheField) {
  const std::string job = InsertJob(*pool_, tenant_a_);
  auto bad = Start(Admin(), job, 0, -1, -5);
  ASSERT_TRUE(absl::IsInvalidArgument(bad.status()));
  EXPECT_THAT(bad.status().message(), HasSubstr("attempt"));
  EXPECT_THAT(bad.status().message(), HasSubstr("step"));
  EXPECT_THAT(bad.status().message(), HasSubstr("size_bytes"));
  v1::StartUploadRequest request;
  request.set_job("jobs/not-a-uuid");
  request.set_attempt(1);
  EXPECT_TRUE(absl::IsNotFound(manager_->StartUpload(Admin(), request).status()));
  // Texts the database would refuse (jsonb holds no NUL) or cut are refused by name first.
  request.set_job(JobName(job));
  (*request.mutable_metadata())["format"] = std::string("a\0b", 3);
  EXPECT_THAT(manager_->StartUpload(Admin(), request).status().message(),
              HasSubstr("metadata: a key or value holds a NUL character"));
  request.clear_metadata();
  request.set_request_id(std::string(65, 'r'));
  EXPECT_THAT(manager_->StartUpload(Admin(), request).status().message(),
              HasSubstr("request_id: is 65 characters long; at most 64"));
}

TEST_F(CheckpointManagerTest, AStragglerOfAFailedAttemptCannotUploadOrCommit) {
  const std::string job = InsertJob(*pool_, tenant_a_);
  const std::string data = Blob(1000);
  auto before = Start(Admin(), job, 1, 50, 1000);  // attempt 1, still current
  ASSERT_TRUE(before.ok());
  ASSERT_TRUE(Write(Admin(), *before, data, 0, 500).ok());
  Restart(*pool_, job);

  EXPECT_TRUE(absl::IsFailedPrecondition(Start(Admin(), job, 1, 60, 10).status()));
  EXPECT_TRUE(absl::IsFailedPrecondition(Write(Admin(), *before, data, 500, 1000).status()));
  auto late = Commit(Admin(), *before, Sha256Hex(data));
  EXPECT_TRUE(absl::IsFailedPrecondition(late.status())) << late.status();
  EXPECT_TRUE(absl::IsNotFound(manager_->GetLatest(Admin(), JobName(job)).status()));
  // The current attempt may.
  EXPECT_TRUE(Start(Admin(), job, 2, 60, 10).ok());
  // An attempt being stopped (RESTARTING) still saves: its rank 0 checkpoints its last step.
  const std::string restarting = InsertJob(*pool_, tenant_a_, "RESTARTING", 1);
  EXPECT_TRUE(Start(Admin(), restarting, 1, 1, 10).ok());
  // Nor does a job that is not placed (or has ended).
  const std::string cancelled = InsertJob(*pool_, tenant_a_, "PENDING", 1);
  auto refused = Start(Admin(), cancelled, 1, 1, 10);
  EXPECT_TRUE(absl::IsFailedPrecondition(refused.status()));
  EXPECT_THAT(refused.status().message(), HasSubstr("PENDING"));
}

// A trainer has at most one save in flight: once a later step commits, an earlier upload it
// abandoned (say, refused while the service restarted) can never be the one a restart resumes
// from, and must not stay UPLOADING until the TTL.
TEST_F(CheckpointManagerTest, ACommitDiscardsTheUploadsOfEarlierStepsOfTheJob) {
  const std::string job = InsertJob(*pool_, tenant_a_);
  const std::string other_job = InsertJob(*pool_, tenant_a_);
  const std::string data = Blob(1000);
  auto abandoned = Start(Admin(), job, 1, 200, 1000);
  ASSERT_TRUE(abandoned.ok());
  ASSERT_TRUE(Write(Admin(), *abandoned, data, 0, 500).ok());
  auto elsewhere = Start(Admin(), other_job, 1, 100, 1000);  // another job's is not touched
  ASSERT_TRUE(elsewhere.ok());
  auto later = Start(Admin(), job, 1, 400, 1000);  // a later step, still uploading: kept
  ASSERT_TRUE(later.ok());
  Save(job, 1, 300, data);

  std::vector<std::pair<int64_t, v1::Checkpoint::State>> listed;
  for (const v1::Checkpoint& c : ListAll(Admin(), job)) listed.emplace_back(c.step(), c.state());
  EXPECT_EQ(listed, (std::vector<std::pair<int64_t, v1::Checkpoint::State>>{
                        {400, v1::Checkpoint::UPLOADING}, {300, v1::Checkpoint::COMMITTED}}));
  EXPECT_EQ(ListAll(Admin(), other_job).size(), 1u);
  EXPECT_TRUE(absl::IsNotFound(Write(Admin(), *abandoned, data, 500, 1000).status()));
  EXPECT_TRUE(absl::IsNotFound(Commit(Admin(), *abandoned, Sha256Hex(data)).status()));
}

// Every rank has a job token of its own: a node token, shared by the agents, reads and writes
// no job's checkpoints (and says so before any row is read). Tenants never upload.
TEST_F(CheckpointManagerTest, ANodeTokenHasNoCheckpointRightsAndATenantNeverUploads) {
  const std::string job = InsertJob(*pool_, tenant_a_);
  const v1::Checkpoint saved = Save(job, 1, 5, Blob(10));
  const Caller node = As(node_token_);
  for (const absl::Status& refused :
       {Start(node, job, 1, 6, 10).status(), manager_->OpenUpload(node, "x").status(),
        manager_->GetLatest(node, JobName(job)).status(), ReadAll(node, saved.name()).status(),
        Commit(node, "x", Sha256Hex("x")).status(), manager_->Delete(node, saved.name())}) {
    EXPECT_TRUE(absl::IsPermissionDenied(refused)) << refused;
    EXPECT_THAT(refused.message(), HasSubstr("node token"));
  }
  v1::ListCheckpointsRequest list;
  list.set_parent(JobName(job));
  EXPECT_TRUE(absl::IsPermissionDenied(manager_->List(node, list).status()));
  EXPECT_TRUE(absl::IsPermissionDenied(Start(As(token_a_), job, 1, 7, 10).status()));
  // The rank of the job's attempt, with its own token, does both.
  ASSERT_TRUE(Start(Rank(job, 1), job, 1, 8, 10).ok());
  EXPECT_TRUE(ReadAll(Rank(job, 1, /*rank=*/1), saved.name()).ok());
}

TEST_F(CheckpointManagerTest, ATenantSeesOnlyItsOwnJobsCheckpoints) {
  const std::string job = InsertJob(*pool_, tenant_a_);
  const v1::Checkpoint saved = Save(job, 1, 10, Blob(100));
  const Caller a = As(token_a_), b = As(token_b_);
  EXPECT_EQ(ListAll(a, job).size(), 1u);
  EXPECT_TRUE(manager_->GetLatest(a, JobName(job)).ok());
  EXPECT_EQ(*ReadAll(a, saved.name()), Blob(100));

  v1::ListCheckpointsRequest list;
  list.set_parent(JobName(job));
  EXPECT_TRUE(absl::IsNotFound(manager_->List(b, list).status()));
  EXPECT_TRUE(absl::IsNotFound(manager_->GetLatest(b, JobName(job)).status()));
  EXPECT_TRUE(absl::IsNotFound(ReadAll(b, saved.name()).status()));
  EXPECT_TRUE(absl::IsNotFound(manager_->Delete(b, saved.name())));
  // Exactly as for a job that does not exist.
  list.set_parent("jobs/00000000-0000-4000-8000-000000000000");
  EXPECT_TRUE(absl::IsNotFound(manager_->List(b, list).status()));

  ASSERT_TRUE(manager_->Delete(a, saved.name()).ok());
  EXPECT_TRUE(absl::IsNotFound(manager_->Delete(a, saved.name())));
  EXPECT_TRUE(ListAll(a, job).empty());
  EXPECT_TRUE(blobs_->ListBlobs()->empty());
}

TEST_F(CheckpointManagerTest, PastItsTransferLimitACallerIsRefusedWhileOthersStillTransfer) {
  NewManager({.chunk_size_bytes = 64 << 10, .max_transfers = 3, .max_transfers_per_caller = 1});
  const std::string job = InsertJob(*pool_, tenant_a_);
  const Caller trainer = Rank(job, 1);
  const v1::Checkpoint saved = Save(job, 1, 10, Blob(1000));
  const Caller a = As(token_a_);

  auto first = manager_->OpenDownload(a, saved.name(), 0);
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = manager_->OpenDownload(a, saved.name(), 0);
  ASSERT_TRUE(absl::IsResourceExhausted(second.status())) << second.status();
  EXPECT_THAT(second.status().message(), HasSubstr("--max-transfers-per-caller"));
  // The tenant's limit holds back no one else: its job's trainer still uploads and reads.
  auto upload = Start(trainer, job, 1, 20, 10);
  ASSERT_TRUE(upload.ok()) << upload.status();
  auto writer = manager_->OpenUpload(trainer, *upload);
  ASSERT_TRUE(writer.ok()) << writer.status();
  EXPECT_TRUE(ReadAll(Admin(), saved.name()).ok());
  // Three transfers in all (the tenant's download, the trainer's stream, the admin's): full.
  auto third = manager_->OpenDownload(Admin(), saved.name(), 0);
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_THAT(metrics_->Scrape(), HasSubstr("gradhub_checkpoint_transfers_in_progress 3"));
  auto refused = manager_->OpenDownload(As(token_a_), saved.name(), 0);
  EXPECT_TRUE(absl::IsResourceExhausted(refused.status()));
  EXPECT_THAT(metrics_->Scrape(), HasSubstr("reason=\"too_many_transfers\""));

  // A transfer's end frees its slot.
  first->reset();
  third->reset();
  writer->reset();
  EXPECT_EQ(*ReadAll(a, saved.name()), Blob(1000));
  EXPECT_THAT(metrics_->Scrape(), HasSubstr("gradhub_checkpoint_transfers_in_progress 0"));
}

TEST_F(CheckpointManagerTest, RetentionKeepsExactlyKeepLastOfTheHighestSteps) {
  const std::string job = InsertJob(*pool_, tenant_a_, "RUNNING", 1, /*keep_last=*/2);
  for (int64_t step : {10, 30, 20, 40, 50}) Save(job, 1, step, Blob(1000, static_cast<int>(step)));
  std::vector<int64_t> steps;
  for (const v1::Checkpoint& c : ListAll(Admin(), job)) steps.push_back(c.step());
  EXPECT_EQ(steps, (std::vector<int64_t>{50, 40}));
  manager_->WaitForRemovals();  // the retired blobs go after the commit answered
  EXPECT_EQ(blobs_->ListBlobs()->size(), 2u);
  EXPECT_EQ(Count("SELECT count(*)::bigint AS n FROM checkpoints"), 2);

  // Without checkpoint.keepLast in the spec: 3.
  const std::string other = InsertJob(*pool_, tenant_a_);
  for (int64_t step = 1; step <= 5; ++step) Save(other, 1, step, Blob(10));
  EXPECT_EQ(ListAll(Admin(), other, "state=COMMITTED").size(), 3u);
}

TEST_F(CheckpointManagerTest, ACorruptBlobIsDataLossMarkedBadAndTheOneBeforeIsLatest) {
  const std::string job = InsertJob(*pool_, tenant_a_);
  const std::string data = Blob(200000, 1);
  Save(job, 1, 10, Blob(1000, 2));
  const v1::Checkpoint newest = Save(job, 1, 20, data);
  FlipByte(BlobPathOf(newest), 150000);

  // Every chunk but the last one goes out; the last only once the whole blob matched.
  auto download = manager_->OpenDownload(As(token_a_), newest.name(), 0);
  ASSERT_TRUE(download.ok());
  std::string received, chunk;
  absl::Status status;
  while ((status = (*download)->Next(&chunk)).ok() && !chunk.empty()) received += chunk;
  EXPECT_TRUE(absl::IsDataLoss(status)) << status;
  EXPECT_LT(received.size(), data.size());

  const std::vector<v1::Checkpoint> listed = ListAll(Admin(), job);
  ASSERT_EQ(listed.size(), 2u);
  EXPECT_EQ(listed[0].state(), v1::Checkpoint::BAD);
  EXPECT_EQ(Events(job).back(), v1::JobEvent::CHECKPOINT_CORRUPT);
  auto event = pool_->Exec(
      "SELECT message FROM job_events WHERE type = 'CHECKPOINT_CORRUPT' AND job_id = $1::uuid",
      {job});
  EXPECT_THAT(event->row(0).Get<std::string>("message"), HasSubstr("step 20"));
  EXPECT_EQ(manager_->GetLatest(Admin(), JobName(job))->step(), 10);
  // Never served again; the step can be saved anew.
  EXPECT_TRUE(absl::IsDataLoss(ReadAll(Admin(), newest.name()).status()));
  EXPECT_TRUE(Start(Admin(), job, 1, 20, 10).ok());
}

TEST_F(CheckpointManagerTest, AResumedDownloadAlsoChecksTheBytesBeforeItsOffset) {
  const std::string job = InsertJob(*pool_, tenant_a_);
  const v1::Checkpoint saved = Save(job, 1, 10, Blob(100000));
  FlipByte(BlobPathOf(saved), 10);
  EXPECT_TRUE(absl::IsDataLoss(ReadAll(Admin(), saved.name(), 90000).status()));
  EXPECT_EQ(ListAll(Admin(), job)[0].state(), v1::Checkpoint::BAD);
}

TEST_F(CheckpointManagerTest, TheScrubFindsCorruptAndMissingBlobs) {
  const std::string job = InsertJob(*pool_, tenant_a_, "RUNNING", 1, 5);
  Save(job, 1, 10, Blob(5000, 1));
  const v1::Checkpoint flipped = Save(job, 1, 20, Blob(5000, 2));
  const v1::Checkpoint missing = Save(job, 1, 30, Blob(5000, 3));
  auto clean = manager_->Scrub();
  ASSERT_TRUE(clean.ok()) << clean.status();
  EXPECT_EQ(clean->checked, 3);
  EXPECT_EQ(clean->bad, 0);

  FlipByte(BlobPathOf(flipped), 4999);
  std::filesystem::remove(BlobPathOf(missing));
  auto scrubbed = manager_->Scrub();
  ASSERT_TRUE(scrubbed.ok()) << scrubbed.status();
  EXPECT_EQ(scrubbed->bad, 2);
  EXPECT_EQ(ListAll(Admin(), job, "state=BAD").size(), 2u);
  EXPECT_EQ(Count("SELECT count(*)::bigint AS n FROM job_events WHERE type = 'CHECKPOINT_CORRUPT'"),
            2);
  EXPECT_EQ(manager_->GetLatest(Admin(), JobName(job))->step(), 10);
  EXPECT_EQ(manager_->Scrub()->checked, 1);                     // BAD ones are not checked again
  EXPECT_EQ(manager_->Scrub([] { return true; })->checked, 0);  // stopped before the first
}

TEST_F(CheckpointManagerTest, AnUploadResumesAfterARestartAndTheCommitHashesTheBlob) {
  const std::string job = InsertJob(*pool_, tenant_a_);
  const std::string data = Blob(400000, 4);
  auto upload = Start(Admin(), job, 1, 10, 400000);
  ASSERT_TRUE(Write(Admin(), *upload, data, 0, 250000).ok());
  NewManager();  // the server restarted: no hash in memory
  EXPECT_EQ(*WriteOne(Admin(), *upload, 0, ""), 250000);
  ASSERT_TRUE(Write(Admin(), *upload, data, 250000, 400000).ok());
  EXPECT_TRUE(absl::IsDataLoss(Commit(Admin(), *upload, Sha256Hex(data + "!")).status()));
  EXPECT_TRUE(ListAll(Admin(), job).empty());
  EXPECT_TRUE(blobs_->ListBlobs()->empty());  // the committed-then-refuted blob went too

  auto second = Start(Admin(), job, 1, 10, 400000);
  ASSERT_TRUE(Write(Admin(), *second, data, 0, 100000).ok());
  NewManager();
  ASSERT_TRUE(Write(Admin(), *second, data, 100000, 400000).ok());
  auto committed = Commit(Admin(), *second, Sha256Hex(data));
  ASSERT_TRUE(committed.ok()) << committed.status();
  EXPECT_EQ(*ReadAll(Admin(), committed->name()), data);

  // A commit naming no sha256 (as a trainer's): the bytes before the restart were hashed by
  // the manager that is gone, so the content key comes from the blob read back.
  auto third = Start(Admin(), job, 1, 20, 400000);
  ASSERT_TRUE(Write(Admin(), *third, data, 0, 150000).ok());
  NewManager();
  ASSERT_TRUE(Write(Admin(), *third, data, 150000, 400000).ok());
  committed = Commit(Admin(), *third, "");
  ASSERT_TRUE(committed.ok()) << committed.status();
  EXPECT_EQ(committed->sha256(), Sha256Hex(data));
  EXPECT_EQ(committed->crc32c(), Crc32c(data));
}

TEST_F(CheckpointManagerTest, ZeroByteCheckpointsWork) {
  const std::string job = InsertJob(*pool_, tenant_a_);
  auto upload = Start(Admin(), job, 1, 0, 0);
  ASSERT_TRUE(upload.ok());
  auto committed = Commit(Admin(), *upload, Sha256Hex(""));
  ASSERT_TRUE(committed.ok()) << committed.status();
  EXPECT_EQ(*ReadAll(Admin(), committed->name()), "");
}

TEST_F(CheckpointManagerTest, ListPagesNewestStepFirstAndFilters) {
  const std::string job = InsertJob(*pool_, tenant_a_, "RUNNING", 1, 10);
  for (int64_t step = 1; step <= 5; ++step) Save(job, 1, step * 10, Blob(10));
  ASSERT_TRUE(Start(Admin(), job, 1, 60, 10).ok());
  v1::ListCheckpointsRequest request;
  request.set_parent(JobName(job));
  request.set_page_size(4);
  auto first = manager_->List(Admin(), request);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_EQ(first->checkpoints_size(), 4);
  EXPECT_EQ(first->checkpoints(0).step(), 60);
  EXPECT_EQ(first->checkpoints(0).state(), v1::Checkpoint::UPLOADING);
  EXPECT_EQ(first->checkpoints(3).step(), 30);
  request.set_page_token(first->next_page_token());
  auto second = manager_->List(Admin(), request);
  ASSERT_EQ(second->checkpoints_size(), 2);
  EXPECT_EQ(second->checkpoints(1).step(), 10);
  EXPECT_TRUE(second->next_page_token().empty());

  EXPECT_EQ(ListAll(Admin(), job, "state=UPLOADING").size(), 1u);
  EXPECT_EQ(ListAll(Admin(), job, "state=COMMITTED").size(), 5u);
  request.set_page_token("");
  for (const char* bad : {"state=DELETED", "step=3", "state"}) {
    request.set_filter(bad);
    EXPECT_TRUE(absl::IsInvalidArgument(manager_->List(Admin(), request).status())) << bad;
  }
  request.set_filter("");
  request.set_page_token("garbage");
  EXPECT_TRUE(absl::IsInvalidArgument(manager_->List(Admin(), request).status()));
}

TEST_F(CheckpointManagerTest, CleanupAfterACrashRemovesWhatNoRowNeedsAndMarksWhatIsMissing) {
  const std::string job = InsertJob(*pool_, tenant_a_, "RUNNING", 1, 10);
  const v1::Checkpoint kept = Save(job, 1, 10, Blob(100, 1));
  const v1::Checkpoint lost = Save(job, 1, 20, Blob(100, 2));
  std::filesystem::remove(BlobPathOf(lost));
  // An upload file of no row, and a blob of no row (a crash between rename and row).
  ASSERT_TRUE(blobs_->Append("0badf11e-0000-4000-8000-000000000000", 0, "orphan").ok());
  ASSERT_TRUE(blobs_->Append("tmp", 0, "orphan").ok());
  ASSERT_TRUE(blobs_->Commit("tmp", job + "/99-orphan").ok());
  // A stale upload: started two hours ago, last written as long ago.
  auto stale = Start(Admin(), job, 1, 30, 100);
  ASSERT_TRUE(Write(Admin(), *stale, Blob(100), 0, 50).ok());
  ASSERT_TRUE(pool_
                  ->Exec("UPDATE checkpoints SET create_time = now() - interval '2 hours'"
                         " WHERE upload_id = $1::uuid",
                         {*stale})
                  .ok());
  const auto two_hours_ago = std::filesystem::file_time_type::clock::now() - std::chrono::hours(2);
  std::filesystem::last_write_time(blobs_->UploadPath(*stale), two_hours_ago);
  // A fresh upload stays.
  auto fresh = Start(Admin(), job, 1, 40, 100);
  ASSERT_TRUE(Write(Admin(), *fresh, Blob(100), 0, 50).ok());
  // A deletion marked but not finished (of an early step: a commit of a later one would
  // supersede the uploads above).
  const std::string marked_blob = BlobPathOf(Save(job, 1, 5, Blob(100, 5)));
  ASSERT_TRUE(pool_->Exec("UPDATE checkpoints SET state = 'DELETED' WHERE step = 5").ok());

  NewManager({.chunk_size_bytes = 64 << 10, .upload_ttl = absl::Hours(1)});
  auto report = manager_->Cleanup();
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->orphan_uploads, 1) << report->ToString();
  EXPECT_EQ(report->stale_uploads, 1) << report->ToString();
  EXPECT_EQ(report->orphan_blobs, 1) << report->ToString();
  EXPECT_EQ(report->missing_blobs, 1) << report->ToString();
  EXPECT_EQ(report->deleted_rows, 1) << report->ToString();

  std::vector<std::pair<int64_t, v1::Checkpoint::State>> rows;
  for (const v1::Checkpoint& c : ListAll(Admin(), job)) rows.emplace_back(c.step(), c.state());
  EXPECT_EQ(rows, (std::vector<std::pair<int64_t, v1::Checkpoint::State>>{
                      {40, v1::Checkpoint::UPLOADING},
                      {20, v1::Checkpoint::BAD},
                      {10, v1::Checkpoint::COMMITTED}}));
  EXPECT_TRUE(absl::IsNotFound(Commit(Admin(), *stale, Sha256Hex(Blob(100))).status()));
  EXPECT_EQ(*ReadAll(Admin(), kept.name()), Blob(100, 1));
  EXPECT_FALSE(std::filesystem::exists(marked_blob));
  EXPECT_EQ(Events(job).back(), v1::JobEvent::CHECKPOINT_CORRUPT);
  // A second pass finds nothing more to do (the BAD row's blob was already missing).
  auto again = manager_->Cleanup();
  EXPECT_EQ(again->ToString(), CleanupReport().ToString());
}

}  // namespace
}  // namespace gradhub::checkpoint::testing
