// The real gradhub-checkpoint binary, SIGKILLed in the middle of an upload and started again on
// the same data directory and database: nothing partial is resumable, the upload resumes at the
// offset the server reports (the end of its last whole sealed chunk: blobs are encrypted at rest
// under the fixture's master key), and it commits. Then a SIGTERM ends it with exit code 0.
// Also its key commands, as an operator runs them (rotate-key, rewrap-keys), and its refusal to
// serve with a master key that did not wrap the data keys.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <regex>
#include <thread>

#include "tests/integration/checkpoint/checkpoint_test_util.h"
#include "tests/support/subprocess.h"

namespace gradhub::checkpoint::testing {
namespace {

constexpr int kChunk = 1 << 20;
// What the server holds once its first batch of 4 MiB is written: the whole sealed chunks in it
// (the rest of a chunk stays in memory until the next batch, and dies with the process).
constexpr int64_t kFirstBatch = 4 * sealed::kChunkBytes;

class CheckpointCrashTest : public CheckpointTest {
 protected:
  // Starts the server and returns its gRPC address, or "" (with a failure) when it does not
  // come up.
  std::string StartServer() {
    server_ = std::make_unique<gradhub::testing::Subprocess>(
        std::vector<std::string>{gradhub::testing::BinaryPath("gradhub-checkpoint"),
                                 "--database-url",
                                 url_,
                                 "--grpc-host",
                                 "127.0.0.1",
                                 "--grpc-port",
                                 "0",
                                 "--http-host",
                                 "127.0.0.1",
                                 "--http-port",
                                 "0",
                                 "--data-dir",
                                 data_dir_,
                                 "--master-key-file",
                                 master_key_file_,
                                 "--admin-token",
                                 kAdminToken,
                                 "--shutdown-grace",
                                 "2s",
                                 "serve"});
    static const std::regex kServing("serving gRPC on port ([0-9]+)");
    for (int i = 0; i < 600 && server_->running(); ++i) {
      std::smatch match;
      const std::string out = server_->out();
      if (std::regex_search(out, match, kServing)) return "127.0.0.1:" + match[1].str();
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ADD_FAILURE() << "gradhub-checkpoint did not start:\n" << server_->err();
    return "";
  }

  std::unique_ptr<v1::CheckpointService::Stub> Connect(const std::string& address) {
    grpc::ChannelArguments args;
    args.SetMaxSendMessageSize(4 << 20);
    return v1::CheckpointService::NewStub(
        grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args));
  }

  // The bytes the server holds of `upload`, as a store opened now on its files reads them.
  absl::StatusOr<int64_t> OnDisk(const std::string& upload) {
    return SealedBlobStore(blobs_.get(), keys_.get(), scopes_.get()).UploadedBytes(upload);
  }

  std::unique_ptr<gradhub::testing::Subprocess> server_;
};

TEST_F(CheckpointCrashTest, AnUploadInterruptedByAKillResumesAtTheServersOffsetAndCommits) {
  SealBlobs();  // what the server writes, the fixture's manager reads
  std::string address = StartServer();
  ASSERT_FALSE(address.empty());
  const std::string job = InsertJob(*pool_, tenant_a_);
  const std::string data = Blob(12 * kChunk, 11);
  const CallAs admin;
  auto stub = Connect(address);
  v1::StartUploadResponse started;
  {
    auto context = Context(admin);
    v1::StartUploadRequest request;
    request.set_job(JobName(job));
    request.set_attempt(1);
    request.set_step(500);
    request.set_size_bytes(static_cast<int64_t>(data.size()));
    ASSERT_TRUE(stub->StartUpload(context.get(), request, &started).ok());
    EXPECT_EQ(started.chunk_size_bytes(), kChunk);
  }
  {
    // Half the chunks on an open stream, then the server dies under it.
    auto context = Context(admin);
    v1::UploadChunksResponse response;
    auto writer = stub->UploadChunks(context.get(), &response);
    for (int i = 0; i < 6; ++i) {
      v1::UploadChunkRequest chunk;
      chunk.set_upload_id(started.upload_id());
      chunk.set_offset(static_cast<int64_t>(i) * kChunk);
      chunk.set_data(data.substr(static_cast<size_t>(i) * kChunk, kChunk));
      ASSERT_TRUE(writer->Write(chunk));
    }
    for (int i = 0; i < 500 && *OnDisk(started.upload_id()) < kFirstBatch; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    server_->Kill(SIGKILL);
    EXPECT_EQ(server_->Wait(), 128 + SIGKILL);
    EXPECT_FALSE(writer->Finish().ok());
  }

  address = StartServer();
  ASSERT_FALSE(address.empty());
  stub = Connect(address);
  // Nothing to resume from: the upload is listed as what it is, UPLOADING.
  const std::vector<v1::Checkpoint> listed = ListAll(Admin(), job);
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0].state(), v1::Checkpoint::UPLOADING);
  {
    auto context = Context(admin);
    v1::GetLatestCheckpointRequest request;
    request.set_job(JobName(job));
    v1::Checkpoint latest;
    EXPECT_EQ(stub->GetLatestCheckpoint(context.get(), request, &latest).error_code(),
              grpc::StatusCode::NOT_FOUND);
  }
  const int64_t held = Probe(*stub, admin, started.upload_id());
  EXPECT_GE(held, kFirstBatch);
  EXPECT_LE(held, 6 * kChunk);
  ASSERT_TRUE(SendChunks(*stub, admin, started.upload_id(), data, static_cast<size_t>(held),
                         data.size(), kChunk)
                  .ok());
  v1::Checkpoint checkpoint;
  {
    auto context = Context(admin);
    v1::CommitCheckpointRequest request;
    // No sha256, as a trainer commits: the bytes written before the kill were hashed by the
    // process that died, so this one reads the blob back for the content key it records.
    request.set_upload_id(started.upload_id());
    request.set_crc32c(Crc32c(data));
    const grpc::Status committed = stub->CommitCheckpoint(context.get(), request, &checkpoint);
    ASSERT_TRUE(committed.ok()) << committed.error_message();
  }
  EXPECT_EQ(checkpoint.sha256(), Sha256Hex(data));
  EXPECT_EQ(checkpoint.crc32c(), Crc32c(data));
  std::string downloaded;
  ASSERT_TRUE(Download(*stub, admin, checkpoint.name(), 0, &downloaded).ok());
  EXPECT_TRUE(downloaded == data);

  server_->Kill(SIGTERM);
  EXPECT_EQ(server_->Wait(std::chrono::seconds(20)), 0) << server_->err();
  EXPECT_THAT(server_->err(), ::testing::HasSubstr("cleanup: "));
}

TEST_F(CheckpointCrashTest, KeyCommandsRotateAndRewrapAndAStaleMasterKeyIsRefused) {
  SealBlobs();
  const std::string job = InsertJob(*pool_, tenant_a_);
  const std::string data = Blob(300000, 3);
  const v1::Checkpoint saved = Save(job, 1, 10, data);  // sealed under the fixture's master key
  const auto run = [&](const std::vector<std::string>& args) {
    std::vector<std::string> argv = {gradhub::testing::BinaryPath("gradhub-checkpoint"),
                                     "--database-url", url_, "--data-dir", data_dir_};
    argv.insert(argv.end(), args.begin(), args.end());
    return gradhub::testing::Run(argv);
  };
  const auto rotated = run({"--master-key-file", master_key_file_, "rotate-key", "team-a"});
  EXPECT_EQ(rotated.exit_code, 0) << rotated.err;
  EXPECT_EQ(Count("SELECT count(*) AS n FROM checkpoint_keys WHERE tenant_id = $1"
                  " AND retire_time IS NULL",
                  {tenant_a_}),
            1);
  EXPECT_EQ(Count("SELECT count(*) AS n FROM checkpoint_keys WHERE tenant_id = $1", {tenant_a_}),
            2);
  EXPECT_EQ(run({"--master-key-file", master_key_file_, "rotate-key", "nobody"}).exit_code, 2);

  // A new master key: the server refuses it until the keys are re-wrapped.
  const std::string next = data_dir_ + "/next.key";
  const auto refused = run({"--master-key-file", next, "--create-master-key", "--grpc-port", "0",
                            "--http-port", "0", "--admin-token", kAdminToken, "serve"});
  EXPECT_EQ(refused.exit_code, 2);
  EXPECT_THAT(refused.err, ::testing::HasSubstr("rewrap-keys"));
  EXPECT_EQ(run({"--master-key-file", next, "rewrap-keys"}).exit_code, 2);  // no old key given
  const auto rewrapped =
      run({"--master-key-file", next, "--old-master-key-file", master_key_file_, "rewrap-keys"});
  EXPECT_EQ(rewrapped.exit_code, 0) << rewrapped.err;
  EXPECT_THAT(rewrapped.err, ::testing::HasSubstr("2 data keys re-wrapped"));

  master_key_file_ = next;
  const std::string address = StartServer();
  ASSERT_FALSE(address.empty());
  std::string downloaded;
  ASSERT_TRUE(Download(*Connect(address), CallAs{}, saved.name(), 0, &downloaded).ok());
  EXPECT_TRUE(downloaded == data);
  server_->Kill(SIGTERM);
  EXPECT_EQ(server_->Wait(std::chrono::seconds(20)), 0) << server_->err();
}

}  // namespace
}  // namespace gradhub::checkpoint::testing
