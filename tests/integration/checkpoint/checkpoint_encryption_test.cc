// Encryption at rest end to end: CheckpointService over real gRPC on loopback, the manager over
// SealedBlobStore, data keys in a real PostgreSQL wrapped by a master key in a file. A saved
// checkpoint is not on disk in the clear and downloads whole and from an offset; a flipped byte
// or another tenant's blob copied over it is DATA_LOSS with nothing of the failing chunk sent,
// and marks it BAD; a tenant's key rotation and a master key's re-wrap keep every checkpoint
// readable; an upload resumes after a restart of the store from its whole chunks.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <iterator>

#include "services/checkpoint/checkpoint_service.h"
#include "tests/integration/checkpoint/checkpoint_test_util.h"
#include "tests/support/grpc_test_server.h"

namespace gradhub::checkpoint::testing {
namespace {

namespace fs = std::filesystem;
using sealed::kChunkBytes;
using ::testing::HasSubstr;

constexpr int32_t kGrpcChunk = 256 << 10;

// Recognizable text: a copy of it on disk shows in a plain search.
std::string Plaintext(size_t size, int seed) {
  std::string text;
  for (int line = 0; text.size() < size; ++line) {
    text += "GRADHUB-PLAINTEXT-" + std::to_string(seed) + "-" + std::to_string(line) + ";";
  }
  text.resize(size);
  return text;
}

std::string Contents(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

class CheckpointEncryptionTest : public CheckpointTest {
 protected:
  void SetUp() override {
    CheckpointTest::SetUp();
    SealBlobs({.chunk_size_bytes = kGrpcChunk});
    StartServer();
  }
  void TearDown() override {
    server_.reset();
    CheckpointTest::TearDown();
  }

  void StartServer() {
    server_.reset();
    service_ = std::make_unique<CheckpointService>(manager_.get(), auth_.get(), metrics_.get());
    server_ = std::make_unique<gradhub::testing::TestGrpcServer>(
        std::vector<grpc::Service*>{service_.get()},
        gradhub::testing::TestGrpcServerOptions{.max_message_bytes = 4 * kGrpcChunk});
    stub_ = v1::CheckpointService::NewStub(server_->NewChannel());
  }

  // StartUpload, UploadChunks and CommitCheckpoint over gRPC as the admin.
  v1::Checkpoint SaveOverGrpc(const std::string& job, int64_t step, const std::string& data) {
    const CallAs admin;
    v1::StartUploadResponse started;
    {
      auto context = Context(admin);
      v1::StartUploadRequest request;
      request.set_job(JobName(job));
      request.set_attempt(1);
      request.set_step(step);
      request.set_size_bytes(static_cast<int64_t>(data.size()));
      EXPECT_TRUE(stub_->StartUpload(context.get(), request, &started).ok());
    }
    EXPECT_TRUE(
        SendChunks(*stub_, admin, started.upload_id(), data, 0, data.size(), kGrpcChunk).ok());
    auto context = Context(admin);
    v1::CommitCheckpointRequest request;
    request.set_upload_id(started.upload_id());
    request.set_sha256(Sha256Hex(data));
    v1::Checkpoint checkpoint;
    const grpc::Status committed = stub_->CommitCheckpoint(context.get(), request, &checkpoint);
    EXPECT_TRUE(committed.ok()) << committed.error_message();
    return checkpoint;
  }

  grpc::Status DownloadOverGrpc(const std::string& name, int64_t offset, std::string* data) {
    return Download(*stub_, CallAs{}, name, offset, data);
  }

  // The whole checkpoint over gRPC; "" (and a failure) when the download fails.
  std::string ReadOverGrpc(const v1::Checkpoint& checkpoint) {
    std::string data;
    const grpc::Status status = DownloadOverGrpc(checkpoint.name(), 0, &data);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return status.ok() ? data : "";
  }

  v1::Checkpoint::State StateOf(const std::string& job) { return ListAll(Admin(), job)[0].state(); }

  sealed::Header HeaderOf(const v1::Checkpoint& checkpoint) {
    return *sealed::Header::Parse(Contents(BlobPathOf(checkpoint)).substr(0, sealed::kHeaderBytes));
  }

  std::unique_ptr<CheckpointService> service_;
  std::unique_ptr<gradhub::testing::TestGrpcServer> server_;
  std::unique_ptr<v1::CheckpointService::Stub> stub_;
};

TEST_F(CheckpointEncryptionTest, ACheckpointIsSealedOnDiskUnderItsTenantsKeyAndDownloadsWhole) {
  const std::string job = InsertJob(*pool_, tenant_a_);
  const std::string data = Plaintext(2 * kChunkBytes + 4321, 1);
  const v1::Checkpoint saved = SaveOverGrpc(job, 10, data);
  const std::string file = Contents(BlobPathOf(saved));
  EXPECT_EQ(file.find("GRADHUB-PLAINTEXT"), std::string::npos);
  EXPECT_EQ(static_cast<int64_t>(file.size()), sealed::SealedSize(data.size()));
  EXPECT_EQ(saved.size_bytes(), static_cast<int64_t>(data.size()));
  // The key: tenant A's, wrapped by the master key, in PostgreSQL.
  auto key =
      pool_->Exec("SELECT id::text AS id, master_key_id FROM checkpoint_keys WHERE tenant_id = $1",
                  {tenant_a_});
  ASSERT_TRUE(key.ok() && key->rows() == 1);
  EXPECT_EQ(key->row(0).Get<std::string>("master_key_id"), master_->id());
  EXPECT_EQ(UuidText(HeaderOf(saved).key_id), key->row(0).Get<std::string>("id"));

  std::string downloaded;
  ASSERT_TRUE(DownloadOverGrpc(saved.name(), 0, &downloaded).ok());
  EXPECT_TRUE(downloaded == data);
  // A resumed download, from the middle of the second chunk.
  const int64_t offset = kChunkBytes + 777;
  ASSERT_TRUE(DownloadOverGrpc(saved.name(), offset, &downloaded).ok());
  EXPECT_TRUE(downloaded == data.substr(offset));
  // The scrub reads it through the same seal.
  EXPECT_EQ(manager_->Scrub()->bad, 0);
}

TEST_F(CheckpointEncryptionTest, AFlippedByteIsDataLossNothingOfItsChunkIsSentAndItIsMarkedBad) {
  const std::string job = InsertJob(*pool_, tenant_a_);
  const std::string data = Plaintext(3 * kChunkBytes, 2);
  const v1::Checkpoint saved = SaveOverGrpc(job, 10, data);
  // A byte in the middle of the second chunk's record.
  FlipByte(BlobPathOf(saved), sealed::RecordOffset(1) + kChunkBytes / 2);
  std::string received;
  const grpc::Status status = DownloadOverGrpc(saved.name(), 0, &received);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DATA_LOSS) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("chunk 1"));
  EXPECT_LE(received.size(), static_cast<size_t>(kChunkBytes));
  EXPECT_TRUE(received == data.substr(0, received.size()));
  EXPECT_EQ(StateOf(job), v1::Checkpoint::BAD);
}

TEST_F(CheckpointEncryptionTest, AnotherTenantsBlobCopiedOverACheckpointIsRefusedBeforeAnyByte) {
  const std::string mine = InsertJob(*pool_, tenant_a_);
  const std::string theirs = InsertJob(*pool_, tenant_b_);
  const v1::Checkpoint saved = SaveOverGrpc(mine, 10, Plaintext(100000, 3));
  const v1::Checkpoint other = SaveOverGrpc(theirs, 10, Plaintext(100000, 4));
  fs::copy_file(BlobPathOf(other), BlobPathOf(saved), fs::copy_options::overwrite_existing);
  std::string received;
  const grpc::Status status = DownloadOverGrpc(saved.name(), 0, &received);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DATA_LOSS) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr(absl::StrCat("tenant:", tenant_b_)));
  EXPECT_TRUE(received.empty());
  EXPECT_EQ(StateOf(mine), v1::Checkpoint::BAD);
  EXPECT_EQ(ReadOverGrpc(other), Plaintext(100000, 4));  // theirs is untouched
}

TEST_F(CheckpointEncryptionTest, ACheckpointOfAnotherJobCopiedOverOneIsRefusedBeforeAnyByte) {
  const std::string job = InsertJob(*pool_, tenant_a_);
  const std::string sibling = InsertJob(*pool_, tenant_a_);
  const v1::Checkpoint saved = SaveOverGrpc(job, 10, Plaintext(100000, 5));
  const v1::Checkpoint other = SaveOverGrpc(sibling, 10, Plaintext(100000, 6));
  fs::copy_file(BlobPathOf(other), BlobPathOf(saved), fs::copy_options::overwrite_existing);
  std::string received;
  EXPECT_EQ(DownloadOverGrpc(saved.name(), 0, &received).error_code(), grpc::StatusCode::DATA_LOSS);
  EXPECT_TRUE(received.empty());
}

TEST_F(CheckpointEncryptionTest, ARotatedTenantKeySealsNewCheckpointsAndTheOldOnesStillRead) {
  const std::string job = InsertJob(*pool_, tenant_a_);
  const std::string before = Plaintext(50000, 7), after = Plaintext(50000, 8);
  const v1::Checkpoint old_checkpoint = SaveOverGrpc(job, 10, before);
  const absl::StatusOr<DataKey> rotated = keys_->Rotate(KeyScope::Tenant(tenant_a_));
  ASSERT_TRUE(rotated.ok()) << rotated.status();
  const v1::Checkpoint new_checkpoint = SaveOverGrpc(job, 20, after);
  EXPECT_NE(HeaderOf(old_checkpoint).key_id, rotated->id);
  EXPECT_EQ(HeaderOf(new_checkpoint).key_id, rotated->id);
  EXPECT_EQ(Count("SELECT count(*) AS n FROM checkpoint_keys WHERE tenant_id = $1"
                  " AND retire_time IS NOT NULL",
                  {tenant_a_}),
            1);
  EXPECT_EQ(ReadOverGrpc(old_checkpoint), before);
  EXPECT_EQ(ReadOverGrpc(new_checkpoint), after);
}

TEST_F(CheckpointEncryptionTest, AfterAMasterKeyRewrapEveryCheckpointStillReadsUnderTheNewKey) {
  const std::string job = InsertJob(*pool_, tenant_a_);
  const std::string other_job = InsertJob(*pool_, tenant_b_);
  const std::string data = Plaintext(70000, 9);
  const v1::Checkpoint a = SaveOverGrpc(job, 10, data);
  const v1::Checkpoint b = SaveOverGrpc(other_job, 10, data);
  ASSERT_TRUE(keys_->Rotate(KeyScope::Tenant(tenant_a_)).ok());  // retired keys re-wrap too

  const MasterKey next = *MasterKey::Create(data_dir_ + "/next.key");
  KeyStore rewrapping(pool_.get(), &next);
  EXPECT_TRUE(absl::IsFailedPrecondition(rewrapping.CheckAllWrappedByMaster()));
  const absl::StatusOr<int> rewrapped = rewrapping.Rewrap(*master_);
  ASSERT_TRUE(rewrapped.ok()) << rewrapped.status();
  EXPECT_EQ(*rewrapped, 3);
  EXPECT_EQ(*rewrapping.Rewrap(*master_), 0);  // again: nothing left
  EXPECT_TRUE(rewrapping.CheckAllWrappedByMaster().ok());
  const absl::Status stale = KeyStore(pool_.get(), master_.get()).CheckAllWrappedByMaster();
  EXPECT_TRUE(absl::IsFailedPrecondition(stale)) << stale;
  EXPECT_THAT(std::string(stale.message()), HasSubstr("rewrap-keys"));

  // A server started with the new master key reads both tenants' checkpoints.
  server_.reset();
  master_ = std::make_unique<MasterKey>(next);
  keys_ = std::make_unique<KeyStore>(pool_.get(), master_.get());
  SealBlobs({.chunk_size_bytes = kGrpcChunk});
  StartServer();
  EXPECT_EQ(ReadOverGrpc(a), data);
  EXPECT_EQ(ReadOverGrpc(b), data);
}

TEST_F(CheckpointEncryptionTest, AnUploadResumesAfterTheStoreRestartsFromItsWholeChunks) {
  const std::string job = InsertJob(*pool_, tenant_a_);
  const std::string data = Plaintext(3 * kChunkBytes + 1000, 10);
  auto upload = Start(Admin(), job, 1, 10, static_cast<int64_t>(data.size()));
  ASSERT_TRUE(upload.ok()) << upload.status();
  ASSERT_TRUE(Write(Admin(), *upload, data, 0, 2 * kChunkBytes + 500, kGrpcChunk).ok());
  server_.reset();
  SealBlobs({.chunk_size_bytes = kGrpcChunk});  // a restart: the unsealed tail is gone
  StartServer();
  const absl::StatusOr<int64_t> held = WriteOne(Admin(), *upload, 0, "");
  ASSERT_TRUE(held.ok()) << held.status();
  EXPECT_EQ(*held, 2 * kChunkBytes);
  ASSERT_TRUE(
      Write(Admin(), *upload, data, static_cast<size_t>(*held), data.size(), kGrpcChunk).ok());
  const absl::StatusOr<v1::Checkpoint> committed = Commit(Admin(), *upload, Sha256Hex(data));
  ASSERT_TRUE(committed.ok()) << committed.status();
  EXPECT_EQ(*ReadAll(Admin(), committed->name()), data);
}

}  // namespace
}  // namespace gradhub::checkpoint::testing
