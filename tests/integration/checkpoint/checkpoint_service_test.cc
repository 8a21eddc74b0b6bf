// CheckpointService over real gRPC on loopback, as a trainer (with its rank's job token) and a
// tenant use it: chunked uploads, a stream broken half way and resumed from the server's count,
// gaps, downloads, tenant isolation, and the job token's scope (its own job and attempt, while
// that attempt is current) and the node token's lack of rights on the gRPC path.
#include "services/checkpoint/checkpoint_service.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <optional>
#include <thread>

#include "tests/integration/checkpoint/checkpoint_test_util.h"
#include "tests/support/grpc_test_server.h"

namespace gradhub::checkpoint::testing {
namespace {

using ::testing::HasSubstr;

constexpr int32_t kChunk = 64 << 10;

class CheckpointServiceTest : public CheckpointTest {
 protected:
  void SetUp() override {
    CheckpointTest::SetUp();
    NewManager({.chunk_size_bytes = kChunk});
    service_ = std::make_unique<CheckpointService>(manager_.get(), auth_.get(), metrics_.get());
    server_ = std::make_unique<gradhub::testing::TestGrpcServer>(
        std::vector<grpc::Service*>{service_.get()},
        gradhub::testing::TestGrpcServerOptions{.max_message_bytes = 4 * kChunk});
    stub_ = v1::CheckpointService::NewStub(server_->NewChannel());
    job_ = InsertJob(*pool_, tenant_a_);
    trainer_ = {auth_->CreateJobToken(job_, 1, /*rank=*/0)->secret};
  }
  void TearDown() override {
    server_.reset();
    CheckpointTest::TearDown();
  }

  v1::StartUploadResponse StartOverGrpc(int64_t step, int64_t size) {
    auto context = Context(trainer_);
    v1::StartUploadRequest request;
    request.set_job(JobName(job_));
    request.set_attempt(1);
    request.set_step(step);
    request.set_size_bytes(size);
    v1::StartUploadResponse response;
    const grpc::Status status = stub_->StartUpload(context.get(), request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return response;
  }

  grpc::Status CommitOverGrpc(const std::string& upload_id, const std::string& sha256,
                              v1::Checkpoint* checkpoint,
                              std::optional<uint32_t> crc32c = std::nullopt) {
    auto context = Context(trainer_);
    v1::CommitCheckpointRequest request;
    request.set_upload_id(upload_id);
    request.set_sha256(sha256);
    if (crc32c.has_value()) request.set_crc32c(*crc32c);
    return stub_->CommitCheckpoint(context.get(), request, checkpoint);
  }

  // Uploads `data` as step `step` in chunks with their crc32c (or without: `chunks`), then
  // commits it with `crc32c` and `sha256` (by default data's; "" leaves it to the store): the
  // commit's status, the checkpoint in *checkpoint.
  grpc::Status UploadAndCommit(int64_t step, const std::string& data,
                               std::optional<uint32_t> crc32c, v1::Checkpoint* checkpoint,
                               ChunkCrc chunks = ChunkCrc::kSent,
                               std::optional<std::string> sha256 = std::nullopt) {
    const v1::StartUploadResponse started = StartOverGrpc(step, static_cast<int64_t>(data.size()));
    EXPECT_TRUE(SendChunks(*stub_, trainer_, started.upload_id(), data, 0, data.size(), kChunk,
                           nullptr, chunks)
                    .ok());
    last_upload_id_ = started.upload_id();
    return CommitOverGrpc(started.upload_id(), sha256.value_or(Sha256Hex(data)), checkpoint,
                          crc32c);
  }

  // What a checkpoint committed by an older store may hold: a row whose sha256 is `sha256`,
  // and whose crc32c is not known to be of the bytes it names (`covers` false).
  void RewriteRow(const v1::Checkpoint& checkpoint, const std::string& sha256, bool covers) {
    ASSERT_TRUE(pool_
                    ->Exec("UPDATE checkpoints SET sha256 = decode($2, 'hex'),"
                           " crc32c_covers_sha256 = $3 WHERE job_id = $1::uuid AND step = $4",
                           {job_, sha256, covers, checkpoint.step()})
                    .ok());
  }

  // The first message of a download of `name`: what it announces.
  v1::DownloadCheckpointResponse FirstDownloadMessage(const std::string& name) {
    auto context = Context(trainer_);
    v1::DownloadCheckpointRequest request;
    request.set_name(name);
    auto reader = stub_->DownloadCheckpoint(context.get(), request);
    v1::DownloadCheckpointResponse first, rest;
    EXPECT_TRUE(reader->Read(&first));
    while (reader->Read(&rest)) EXPECT_FALSE(rest.has_crc32c() || !rest.sha256().empty());
    EXPECT_TRUE(reader->Finish().ok());
    return first;
  }

  // StartUpload and GetLatestCheckpoint as `as`: their status codes.
  grpc::StatusCode StartAs(const CallAs& as, const std::string& job_id, int32_t attempt) {
    auto context = Context(as);
    v1::StartUploadRequest request;
    request.set_job(JobName(job_id));
    request.set_attempt(attempt);
    request.set_step(100);
    request.set_size_bytes(10);
    v1::StartUploadResponse response;
    return stub_->StartUpload(context.get(), request, &response).error_code();
  }
  grpc::StatusCode LatestAs(const CallAs& as, const std::string& job_id,
                            v1::Checkpoint* latest = nullptr) {
    auto context = Context(as);
    v1::GetLatestCheckpointRequest request;
    request.set_job(JobName(job_id));
    v1::Checkpoint answer;
    return stub_->GetLatestCheckpoint(context.get(), request, latest ? latest : &answer)
        .error_code();
  }

  std::unique_ptr<CheckpointService> service_;
  std::unique_ptr<gradhub::testing::TestGrpcServer> server_;
  std::unique_ptr<v1::CheckpointService::Stub> stub_;
  std::string job_;
  CallAs trainer_;  // rank 0 of attempt 1 of job_
  std::string last_upload_id_;
};

TEST_F(CheckpointServiceTest, ATrainerUploadsInChunksCommitsAndDownloads) {
  const std::string data = Blob(5 * kChunk + 123);
  const v1::StartUploadResponse started = StartOverGrpc(100, static_cast<int64_t>(data.size()));
  EXPECT_EQ(started.chunk_size_bytes(), kChunk);
  int64_t received = 0;
  ASSERT_TRUE(
      SendChunks(*stub_, trainer_, started.upload_id(), data, 0, data.size(), kChunk, &received)
          .ok());
  EXPECT_EQ(received, static_cast<int64_t>(data.size()));
  v1::Checkpoint checkpoint;
  const grpc::Status committed = CommitOverGrpc(started.upload_id(), Sha256Hex(data), &checkpoint);
  ASSERT_TRUE(committed.ok()) << committed.error_message();
  EXPECT_EQ(checkpoint.state(), v1::Checkpoint::COMMITTED);

  auto context = Context(trainer_);
  v1::GetLatestCheckpointRequest latest_request;
  latest_request.set_job(JobName(job_));
  v1::Checkpoint latest;
  ASSERT_TRUE(stub_->GetLatestCheckpoint(context.get(), latest_request, &latest).ok());
  EXPECT_EQ(latest.name(), checkpoint.name());
  std::string downloaded, sha256;
  ASSERT_TRUE(Download(*stub_, trainer_, latest.name(), 0, &downloaded, &sha256).ok());
  EXPECT_EQ(sha256, Sha256Hex(data));
  EXPECT_TRUE(downloaded == data);
  ASSERT_TRUE(Download(*stub_, trainer_, latest.name(), 3 * kChunk + 5, &downloaded).ok());
  EXPECT_TRUE(downloaded == data.substr(3 * kChunk + 5));
}

TEST_F(CheckpointServiceTest, ABrokenStreamResumesWhereTheServerStopped) {
  const std::string data = Blob(8 * kChunk, 7);
  const v1::StartUploadResponse started = StartOverGrpc(200, static_cast<int64_t>(data.size()));
  {
    // Three chunks written, then the connection is cut without WritesDone.
    auto context = Context(trainer_);
    v1::UploadChunksResponse response;
    auto writer = stub_->UploadChunks(context.get(), &response);
    for (int i = 0; i < 3; ++i) {
      v1::UploadChunkRequest chunk;
      chunk.set_upload_id(started.upload_id());
      chunk.set_offset(i * kChunk);
      chunk.set_data(data.substr(i * kChunk, kChunk));
      ASSERT_TRUE(writer->Write(chunk));
    }
    // Until the server has stored what was sent (up to 30 s: 2 s did not always do under a
    // full parallel test run), then the client goes away.
    for (int i = 0; i < 3000 && *blobs_->UploadedBytes(started.upload_id()) < 3 * kChunk; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    context->TryCancel();
    EXPECT_FALSE(writer->Finish().ok());
  }
  const int64_t held = Probe(*stub_, trainer_, started.upload_id());
  EXPECT_EQ(held, 3 * kChunk);
  int64_t received = 0;
  ASSERT_TRUE(SendChunks(*stub_, trainer_, started.upload_id(), data, static_cast<size_t>(held),
                         data.size(), kChunk, &received)
                  .ok());
  EXPECT_EQ(received, static_cast<int64_t>(data.size()));
  v1::Checkpoint checkpoint;
  ASSERT_TRUE(CommitOverGrpc(started.upload_id(), Sha256Hex(data), &checkpoint).ok());
  std::string downloaded;
  ASSERT_TRUE(Download(*stub_, trainer_, checkpoint.name(), 0, &downloaded).ok());
  EXPECT_TRUE(downloaded == data);
}

TEST_F(CheckpointServiceTest, AGapEndsTheStreamWithOutOfRange) {
  const std::string data = Blob(4 * kChunk);
  const v1::StartUploadResponse started = StartOverGrpc(300, static_cast<int64_t>(data.size()));
  ASSERT_TRUE(SendChunks(*stub_, trainer_, started.upload_id(), data, 0, kChunk, kChunk).ok());
  const grpc::Status gap =
      SendChunks(*stub_, trainer_, started.upload_id(), data, 2 * kChunk, 3 * kChunk, kChunk);
  EXPECT_EQ(gap.error_code(), grpc::StatusCode::OUT_OF_RANGE);
  EXPECT_THAT(gap.error_message(), HasSubstr("resume at 65536"));
  EXPECT_EQ(Probe(*stub_, trainer_, started.upload_id()), kChunk);
  // Oversized chunks are refused before they are written.
  const grpc::Status big =
      SendChunks(*stub_, trainer_, started.upload_id(), data, kChunk, 3 * kChunk, 2 * kChunk);
  EXPECT_EQ(big.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(CheckpointServiceTest, AChunkWithAWrongCrc32cIsDataLossAndTheUploadGoesOnFromWhatIsHeld) {
  const std::string data = Blob(3 * kChunk, 5);
  const v1::StartUploadResponse started = StartOverGrpc(1, static_cast<int64_t>(data.size()));
  ASSERT_TRUE(SendChunks(*stub_, trainer_, started.upload_id(), data, 0, kChunk, kChunk).ok());
  EXPECT_EQ(SendChunks(*stub_, trainer_, started.upload_id(), data, kChunk, 3 * kChunk, kChunk,
                       nullptr, ChunkCrc::kWrong)
                .error_code(),
            grpc::StatusCode::DATA_LOSS);
  const int64_t held = Probe(*stub_, trainer_, started.upload_id());
  EXPECT_EQ(held, kChunk);
  ASSERT_TRUE(SendChunks(*stub_, trainer_, started.upload_id(), data, static_cast<size_t>(held),
                         data.size(), kChunk)
                  .ok());
  v1::Checkpoint checkpoint;
  ASSERT_TRUE(CommitOverGrpc(started.upload_id(), Sha256Hex(data), &checkpoint).ok());
  std::string downloaded;
  ASSERT_TRUE(Download(*stub_, trainer_, checkpoint.name(), 0, &downloaded).ok());
  EXPECT_TRUE(downloaded == data);
}

TEST_F(CheckpointServiceTest, AWrongShaIsDataLossAndAStragglersTokenIsRefused) {
  // Chunks without crc32c: the server's own sha256 of what it wrote decides.
  const std::string data = Blob(1000);
  const v1::StartUploadResponse started = StartOverGrpc(1, 1000);
  ASSERT_TRUE(SendChunks(*stub_, trainer_, started.upload_id(), data, 0, 1000, kChunk, nullptr,
                         ChunkCrc::kLeftOut)
                  .ok());
  v1::Checkpoint checkpoint;
  EXPECT_EQ(CommitOverGrpc(started.upload_id(), Sha256Hex("other"), &checkpoint).error_code(),
            grpc::StatusCode::DATA_LOSS);

  const v1::StartUploadResponse next = StartOverGrpc(2, 1000);
  Restart(*pool_, job_);
  // The straggler's token died with its attempt; even the admin may not upload for that one.
  EXPECT_EQ(SendChunks(*stub_, trainer_, next.upload_id(), data, 0, 1000, kChunk).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(SendChunks(*stub_, CallAs{}, next.upload_id(), data, 0, 1000, kChunk).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
}

TEST_F(CheckpointServiceTest, ADownloadWithVerifySha256FindsASha256ThatNamesOtherBytes) {
  // A row from before the store hashed uploads itself, which recorded a client's sha256 of
  // other bytes: downloads check the crc32c, which matches.
  const std::string data = Blob(3 * kChunk);
  v1::Checkpoint checkpoint;
  ASSERT_TRUE(UploadAndCommit(1, data, Crc32c(data), &checkpoint).ok());
  RewriteRow(checkpoint, Sha256Hex("other"), /*covers=*/true);
  std::string downloaded, sha256;
  ASSERT_TRUE(Download(*stub_, trainer_, checkpoint.name(), 0, &downloaded, &sha256).ok());
  EXPECT_TRUE(downloaded == data);
  EXPECT_NE(Sha256Hex(downloaded), sha256);  // what the client finds
  const grpc::Status verified =
      Download(*stub_, trainer_, checkpoint.name(), 0, &downloaded, nullptr, true);
  EXPECT_EQ(verified.error_code(), grpc::StatusCode::DATA_LOSS);
  EXPECT_THAT(verified.error_message(), HasSubstr("marked BAD"));
  EXPECT_LT(downloaded.size(), data.size());  // the last chunk was held back
}

TEST_F(CheckpointServiceTest, ACommitWithoutASha256RecordsTheStoresOwnOfTheBytesReceived) {
  // As a trainer commits: chunks with their crc32c, the blob's crc32c, no sha256.
  const std::string data = Blob(4 * kChunk + 9, 7);
  v1::Checkpoint checkpoint;
  const grpc::Status committed =
      UploadAndCommit(1, data, Crc32c(data), &checkpoint, ChunkCrc::kSent, "");
  ASSERT_TRUE(committed.ok()) << committed.error_message();
  EXPECT_EQ(checkpoint.sha256(), Sha256Hex(data));
  EXPECT_EQ(checkpoint.crc32c(), Crc32c(data));
  // Committing it again is idempotent, with or without the sha256.
  v1::Checkpoint again;
  ASSERT_TRUE(CommitOverGrpc(last_upload_id_, "", &again).ok());
  EXPECT_EQ(again.sha256(), Sha256Hex(data));
  ASSERT_TRUE(CommitOverGrpc(last_upload_id_, Sha256Hex(data), &again).ok());
  // Chunks without crc32c: the store's sha256 and the crc32c of the bytes it wrote.
  v1::Checkpoint unchecked;
  ASSERT_TRUE(UploadAndCommit(2, data, std::nullopt, &unchecked, ChunkCrc::kLeftOut, "").ok());
  EXPECT_EQ(unchecked.sha256(), Sha256Hex(data));
  EXPECT_EQ(unchecked.crc32c(), Crc32c(data));
  std::string downloaded, sha256;
  ASSERT_TRUE(Download(*stub_, trainer_, unchecked.name(), 0, &downloaded, &sha256).ok());
  EXPECT_TRUE(downloaded == data);
  EXPECT_EQ(sha256, Sha256Hex(data));
}

TEST_F(CheckpointServiceTest, ASha256ThatIsNotOfTheBytesReceivedIsDataLossWithCheckedChunksToo) {
  const std::string data = Blob(2 * kChunk + 1, 8);
  v1::Checkpoint checkpoint;
  const grpc::Status refused =
      UploadAndCommit(1, data, Crc32c(data), &checkpoint, ChunkCrc::kSent, Sha256Hex("other"));
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::DATA_LOSS);
  EXPECT_THAT(refused.error_message(), HasSubstr("does not match the bytes received"));
  EXPECT_EQ(LatestAs(trainer_, job_), grpc::StatusCode::NOT_FOUND);
  // A malformed one is refused before anything is looked at.
  EXPECT_EQ(CommitOverGrpc(last_upload_id_, "abc", &checkpoint).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(CheckpointServiceTest, ACommitWithTheCrc32cOfTheHashedBytesOffersItToDownloads) {
  const std::string data = Blob(3 * kChunk + 17, 3);
  v1::Checkpoint checkpoint;
  const grpc::Status committed = UploadAndCommit(1, data, Crc32c(data), &checkpoint);
  ASSERT_TRUE(committed.ok()) << committed.error_message();
  ASSERT_TRUE(checkpoint.has_crc32c());
  EXPECT_EQ(checkpoint.crc32c(), Crc32c(data));
  v1::Checkpoint latest;
  ASSERT_EQ(LatestAs(trainer_, job_, &latest), grpc::StatusCode::OK);
  EXPECT_EQ(latest.crc32c(), Crc32c(data));
  const v1::DownloadCheckpointResponse first = FirstDownloadMessage(checkpoint.name());
  ASSERT_TRUE(first.has_crc32c());
  EXPECT_EQ(first.crc32c(), Crc32c(data));
  EXPECT_EQ(first.sha256(), Sha256Hex(data));
}

TEST_F(CheckpointServiceTest, ACommitWhoseCrc32cIsNotOfTheBytesReceivedDiscardsTheUpload) {
  // The client took the crc32c of other bytes than it sent (its memory changed in between).
  const std::string data = Blob(2 * kChunk, 4);
  std::string hashed = data;
  hashed[kChunk + 3] ^= 1;
  v1::Checkpoint checkpoint;
  const grpc::Status refused = UploadAndCommit(1, data, Crc32c(hashed), &checkpoint);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::DATA_LOSS);
  EXPECT_THAT(refused.error_message(), HasSubstr("changed after the client took their crc32c"));
  // Nothing committed, and the upload is gone: a retry starts a new one.
  EXPECT_EQ(CommitOverGrpc(last_upload_id_, Sha256Hex(data), &checkpoint).error_code(),
            grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(LatestAs(trainer_, job_), grpc::StatusCode::NOT_FOUND);
  ASSERT_TRUE(UploadAndCommit(1, data, Crc32c(data), &checkpoint).ok());
}

TEST_F(CheckpointServiceTest, ACrc32cCoversTheSha256OnlyWhereTheHashedBytesAreKnown) {
  const std::string data = Blob(2 * kChunk + 5, 6);
  // Checked chunks, no crc32c in the commit: the store hashed what it received, so its crc32c
  // is of the bytes the sha256 names.
  v1::Checkpoint checked;
  ASSERT_TRUE(UploadAndCommit(1, data, std::nullopt, &checked).ok());
  EXPECT_EQ(checked.crc32c(), Crc32c(data));
  // Chunks without crc32c: likewise.
  v1::Checkpoint unchecked;
  ASSERT_TRUE(UploadAndCommit(2, data, std::nullopt, &unchecked, ChunkCrc::kLeftOut).ok());
  EXPECT_EQ(unchecked.crc32c(), Crc32c(data));
  // A row from an older store whose crc32c was not known to be of those bytes: downloads check
  // the sha256, until a scrub that hashed the blob whole gives it its crc32c.
  RewriteRow(checked, Sha256Hex(data), /*covers=*/false);
  EXPECT_FALSE(FirstDownloadMessage(checked.name()).has_crc32c());
  ASSERT_TRUE(manager_->Scrub().ok());
  const v1::DownloadCheckpointResponse first = FirstDownloadMessage(checked.name());
  ASSERT_TRUE(first.has_crc32c());
  EXPECT_EQ(first.crc32c(), Crc32c(data));
}

TEST_F(CheckpointServiceTest, AnotherTenantsCheckpointsAreNotFound) {
  const v1::Checkpoint saved = Save(job_, 1, 10, Blob(100));
  const CallAs other{token_b_}, owner{token_a_};
  {
    auto context = Context(other);
    v1::ListCheckpointsRequest request;
    request.set_parent(JobName(job_));
    v1::ListCheckpointsResponse response;
    EXPECT_EQ(stub_->ListCheckpoints(context.get(), request, &response).error_code(),
              grpc::StatusCode::NOT_FOUND);
  }
  std::string data;
  EXPECT_EQ(Download(*stub_, other, saved.name(), 0, &data).error_code(),
            grpc::StatusCode::NOT_FOUND);
  {
    auto context = Context(other);
    v1::DeleteCheckpointRequest request;
    request.set_name(saved.name());
    google::protobuf::Empty empty;
    EXPECT_EQ(stub_->DeleteCheckpoint(context.get(), request, &empty).error_code(),
              grpc::StatusCode::NOT_FOUND);
  }
  {
    auto context = Context(owner);
    v1::ListCheckpointsRequest request;
    request.set_parent(JobName(job_));
    v1::ListCheckpointsResponse response;
    ASSERT_TRUE(stub_->ListCheckpoints(context.get(), request, &response).ok());
    EXPECT_EQ(response.checkpoints_size(), 1);
  }
  EXPECT_TRUE(Download(*stub_, owner, saved.name(), 0, &data).ok());
  {
    auto context = Context(owner);
    v1::DeleteCheckpointRequest request;
    request.set_name(saved.name());
    google::protobuf::Empty empty;
    EXPECT_TRUE(stub_->DeleteCheckpoint(context.get(), request, &empty).ok());
  }
  // No token at all.
  auto context = std::make_unique<grpc::ClientContext>();
  v1::GetLatestCheckpointRequest request;
  request.set_job(JobName(job_));
  v1::Checkpoint latest;
  EXPECT_EQ(stub_->GetLatestCheckpoint(context.get(), request, &latest).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
}

TEST_F(CheckpointServiceTest, ACorruptBlobEndsTheDownloadWithDataLoss) {
  const std::string data = Blob(3 * kChunk);
  const v1::Checkpoint saved = Save(job_, 1, 10, data);
  FlipByte(BlobPathOf(saved), 5);
  std::string downloaded;
  EXPECT_EQ(Download(*stub_, trainer_, saved.name(), 0, &downloaded).error_code(),
            grpc::StatusCode::DATA_LOSS);
  EXPECT_LT(downloaded.size(), data.size());  // the last chunk never went out
}

// The gRPC path applies checkpoint_access.h's rule for job tokens: its own job's reads and its
// own attempt's uploads; another job is NOT_FOUND (same tenant or not), another attempt
// PERMISSION_DENIED, and any other rank of the attempt has the same rights (rank 0 saves).
TEST_F(CheckpointServiceTest, AJobTokenActsOnItsOwnJobAndAttemptOnly) {
  const v1::Checkpoint saved = Save(job_, 1, 10, Blob(100));
  const std::string sibling = InsertJob(*pool_, tenant_a_), foreign = InsertJob(*pool_, tenant_b_);
  Save(sibling, 1, 10, Blob(100));
  EXPECT_EQ(StartAs(trainer_, job_, 1), grpc::StatusCode::OK);
  EXPECT_EQ(LatestAs(trainer_, job_), grpc::StatusCode::OK);
  for (const std::string& other : {sibling, foreign}) {
    EXPECT_EQ(StartAs(trainer_, other, 1), grpc::StatusCode::NOT_FOUND);
    EXPECT_EQ(LatestAs(trainer_, other), grpc::StatusCode::NOT_FOUND);
  }
  std::string data;
  EXPECT_EQ(Download(*stub_, trainer_, JobName(sibling) + "/checkpoints/10", 0, &data).error_code(),
            grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(StartAs(trainer_, job_, 2), grpc::StatusCode::PERMISSION_DENIED);
  const CallAs rank1{auth_->CreateJobToken(job_, 1, 1)->secret};
  ASSERT_TRUE(Download(*stub_, rank1, saved.name(), 0, &data).ok());
  EXPECT_TRUE(data == Blob(100));
}

// A job token works only while its attempt is the job's current one and the job has not ended:
// refused (UNAUTHENTICATED, on the very next call: job tokens are never cached) once the job
// restarted, and once it finished.
TEST_F(CheckpointServiceTest, AJobTokenIsRefusedOnceItsAttemptOrItsJobEnded) {
  Save(job_, 1, 10, Blob(100));
  ASSERT_EQ(LatestAs(trainer_, job_), grpc::StatusCode::OK);
  Restart(*pool_, job_);
  EXPECT_EQ(LatestAs(trainer_, job_), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(StartAs(trainer_, job_, 1), grpc::StatusCode::UNAUTHENTICATED);
  std::string data;
  EXPECT_EQ(Download(*stub_, trainer_, JobName(job_) + "/checkpoints/10", 0, &data).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  const CallAs second{auth_->CreateJobToken(job_, 2, 0)->secret};
  EXPECT_EQ(LatestAs(second, job_), grpc::StatusCode::OK);  // the new attempt's rank reads
  for (const char* state : {"RUNNING", "SUCCEEDED"}) {
    const auto moved =
        pool_->Exec("UPDATE jobs SET state = $2 WHERE id = $1::uuid", {job_, std::string(state)});
    ASSERT_TRUE(moved.ok()) << moved.status();
  }
  EXPECT_EQ(LatestAs(second, job_), grpc::StatusCode::UNAUTHENTICATED);
}

// The node token has no rights on checkpoints over gRPC either (PERMISSION_DENIED on every
// call); ranks use their own job tokens.
TEST_F(CheckpointServiceTest, ANodeTokenIsRefusedOnEveryCheckpointCall) {
  const v1::Checkpoint saved = Save(job_, 1, 10, Blob(100));
  const CallAs node{node_token_};
  EXPECT_EQ(StartAs(node, job_, 1), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(LatestAs(node, job_), grpc::StatusCode::PERMISSION_DENIED);
  std::string data;
  EXPECT_EQ(Download(*stub_, node, saved.name(), 0, &data).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  const v1::StartUploadResponse started = StartOverGrpc(20, 10);
  EXPECT_EQ(SendChunks(*stub_, node, started.upload_id(), Blob(10), 0, 10, kChunk).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  auto context = Context(node);
  v1::CommitCheckpointRequest commit;
  commit.set_upload_id(started.upload_id());
  commit.set_sha256(Sha256Hex(Blob(10)));
  v1::Checkpoint checkpoint;
  EXPECT_EQ(stub_->CommitCheckpoint(context.get(), commit, &checkpoint).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
}

}  // namespace
}  // namespace gradhub::checkpoint::testing
