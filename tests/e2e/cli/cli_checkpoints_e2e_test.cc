// `gradhub checkpoints list|download` as a user runs them: the real CLI against a real
// gradhub-checkpoint on a real PostgreSQL, and, for the resume after a broken stream, against an
// in-process CheckpointService that breaks its first download half way.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include "tests/integration/checkpoint/checkpoint_test_util.h"
#include "tests/support/grpc_test_server.h"
#include "tests/support/postgres_server.h"
#include "tests/support/subprocess.h"

namespace gradhub::checkpoint::testing {
namespace {

using gradhub::testing::BinaryPath;
using gradhub::testing::RunResult;
using gradhub::testing::Subprocess;
using ::testing::HasSubstr;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// One gradhub-checkpoint for the whole binary; each test saves under a job of its own.
class CliCheckpointsE2eTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    url_ = new std::string(gradhub::testing::PostgresServer::Shared().CreateDatabase());
    dir_ = new gradhub::testing::TempDir();
    server_ = new Subprocess({BinaryPath("gradhub-checkpoint"), "--database-url", *url_,
                              "--grpc-host", "127.0.0.1", "--grpc-port", "0", "--http-host",
                              "127.0.0.1", "--http-port", "0", "--data-dir", dir_->path() + "/data",
                              "--admin-token", kAdminToken, "serve"});
    static const std::regex kServing("serving gRPC on port ([0-9]+)");
    for (int i = 0; i < 600 && server_->running(); ++i) {
      std::smatch match;
      const std::string out = server_->out();
      if (std::regex_search(out, match, kServing)) {
        address_ = new std::string("127.0.0.1:" + match[1].str());
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ASSERT_NE(address_, nullptr) << "gradhub-checkpoint did not start:\n" << server_->err();
    db::PoolOptions options;
    options.connection.url = *url_;
    pool_ = new db::Pool(options);
    api::Authenticator auth(pool_, "");
    ASSERT_TRUE(auth.CreateTenant("owner", "").ok());
    ASSERT_TRUE(auth.CreateTenant("stranger", "").ok());
    owner_token_ = new std::string(auth.CreateTenantToken("owner", "")->secret);
    stranger_token_ = new std::string(auth.CreateTenantToken("stranger", "")->secret);
    owner_id_ =
        pool_->Exec("SELECT id FROM tenants WHERE name = 'owner'")->row(0).Get<int64_t>("id");
  }
  static void TearDownTestSuite() {
    delete server_;
    delete pool_;
    delete dir_;
    delete address_;
    delete url_;
    delete owner_token_;
    delete stranger_token_;
  }

  // A committed checkpoint of a new job of "owner", saved over gRPC with the admin token.
  // `sha256`, when given, is what its row then says, as an older store recorded a client's
  // claim with a crc32c not known to be of the same bytes (the store now refuses a sha256 that
  // is not of the bytes it received).
  v1::Checkpoint SaveOne(const std::string& data, int64_t step = 100, std::string sha256 = "") {
    job_ = InsertJob(*pool_, owner_id_);
    auto stub = v1::CheckpointService::NewStub(
        grpc::CreateChannel(*address_, grpc::InsecureChannelCredentials()));
    const CallAs admin;
    v1::StartUploadRequest start;
    start.set_job(JobName(job_));
    start.set_attempt(1);
    start.set_step(step);
    start.set_size_bytes(static_cast<int64_t>(data.size()));
    v1::StartUploadResponse started;
    EXPECT_TRUE(stub->StartUpload(Context(admin).get(), start, &started).ok());
    EXPECT_TRUE(SendChunks(*stub, admin, started.upload_id(), data, 0, data.size(),
                           static_cast<size_t>(started.chunk_size_bytes()))
                    .ok());
    v1::CommitCheckpointRequest commit;
    commit.set_upload_id(started.upload_id());
    commit.set_sha256(Sha256Hex(data));
    v1::Checkpoint checkpoint;
    const grpc::Status committed =
        stub->CommitCheckpoint(Context(admin).get(), commit, &checkpoint);
    EXPECT_TRUE(committed.ok()) << committed.error_message();
    if (!sha256.empty()) {
      EXPECT_TRUE(pool_
                      ->Exec("UPDATE checkpoints SET sha256 = decode($2, 'hex'),"
                             " crc32c_covers_sha256 = false WHERE job_id = $1::uuid AND step = $3",
                             {job_, sha256, step})
                      .ok());
    }
    return checkpoint;
  }

  // `gradhub --checkpoint-server S --token T ARGS`, nothing else from the environment.
  RunResult Gradhub(const std::string& token, std::vector<std::string> args,
                    const std::string& server = "") {
    args.insert(args.begin(), {BinaryPath("gradhub"), "--checkpoint-server",
                               server.empty() ? *address_ : server, "--token", token});
    std::map<std::string, std::string> env;
    for (const char* name : {"GRADHUB_SERVER", "GRADHUB_CHECKPOINT_SERVER", "GRADHUB_TOKEN",
                             "GRADHUB_TLS_CA", "GRADHUB_OUTPUT", "GRADHUB_TIMEOUT"}) {
      env.emplace(name, "");
    }
    return gradhub::testing::Run(std::move(args), env, std::chrono::seconds(60));
  }

  gradhub::testing::TempDir out_;
  std::string job_;

  static std::string* url_;
  static gradhub::testing::TempDir* dir_;
  static Subprocess* server_;
  static std::string* address_;
  static db::Pool* pool_;
  static std::string* owner_token_;
  static std::string* stranger_token_;
  static int64_t owner_id_;
};

std::string* CliCheckpointsE2eTest::url_ = nullptr;
gradhub::testing::TempDir* CliCheckpointsE2eTest::dir_ = nullptr;
Subprocess* CliCheckpointsE2eTest::server_ = nullptr;
std::string* CliCheckpointsE2eTest::address_ = nullptr;
db::Pool* CliCheckpointsE2eTest::pool_ = nullptr;
std::string* CliCheckpointsE2eTest::owner_token_ = nullptr;
std::string* CliCheckpointsE2eTest::stranger_token_ = nullptr;
int64_t CliCheckpointsE2eTest::owner_id_ = 0;

TEST_F(CliCheckpointsE2eTest, ListsAJobsCheckpointsAsATableAndAsJson) {
  const v1::Checkpoint saved = SaveOne(Blob(3 << 20));
  RunResult listed = Gradhub(*owner_token_, {"checkpoints", "list", job_});
  ASSERT_EQ(listed.exit_code, 0) << listed.err;
  EXPECT_THAT(listed.out, HasSubstr("NAME"));
  EXPECT_THAT(listed.out, HasSubstr("SHA256"));
  EXPECT_THAT(listed.out, HasSubstr(saved.name()));
  EXPECT_THAT(listed.out, HasSubstr("COMMITTED"));
  EXPECT_THAT(listed.out, HasSubstr("3.0 MiB"));
  EXPECT_THAT(listed.out, HasSubstr(saved.sha256().substr(0, 12)));
  RunResult json =
      Gradhub(*owner_token_, {"checkpoints", "list", "jobs/" + job_, "--output", "json"});
  ASSERT_EQ(json.exit_code, 0) << json.err;
  EXPECT_THAT(json.out, HasSubstr("\"sha256\": \"" + saved.sha256() + "\""));

  RunResult stranger = Gradhub(*stranger_token_, {"checkpoints", "list", job_});
  EXPECT_EQ(stranger.exit_code, 3) << stranger.err;  // NOT_FOUND
  EXPECT_THAT(stranger.err, HasSubstr("NOT_FOUND"));
}

TEST_F(CliCheckpointsE2eTest, DownloadsVerifiesAndWritesTheFileWhole) {
  const std::string data = Blob(5 << 20, 2);
  const v1::Checkpoint saved = SaveOne(data);
  const std::string file = out_.path() + "/ckpt.bin";
  RunResult downloaded =
      Gradhub(*owner_token_, {"checkpoints", "download", saved.name(), "-o", file});
  ASSERT_EQ(downloaded.exit_code, 0) << downloaded.err;
  EXPECT_EQ(downloaded.out, file + "\n");
  EXPECT_THAT(downloaded.err, HasSubstr("verified"));
  EXPECT_TRUE(ReadFile(file) == data);
  EXPECT_FALSE(std::filesystem::exists(file + ".tmp"));

  EXPECT_EQ(Gradhub(*owner_token_, {"checkpoints", "download", saved.name()}).exit_code, 2);
  EXPECT_EQ(Gradhub(*owner_token_, {"checkpoints", "download", "jobs/x", "-o", file}).exit_code, 2);
  EXPECT_EQ(Gradhub(*stranger_token_,
                    {"checkpoints", "download", saved.name(), "-o", out_.path() + "/other.bin"})
                .exit_code,
            3);
}

TEST_F(CliCheckpointsE2eTest, ACorruptCheckpointLeavesNoFile) {
  const v1::Checkpoint saved = SaveOne(Blob(2 << 20, 3));
  auto blob = pool_->Exec("SELECT blob_path FROM checkpoints WHERE job_id = $1::uuid", {job_});
  const std::string path =
      dir_->path() + "/data/blobs/" + blob->row(0).Get<std::string>("blob_path");
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(12345);
    f.put('\x7f');
  }
  const std::string file = out_.path() + "/bad.bin";
  RunResult result = Gradhub(*owner_token_, {"checkpoints", "download", saved.name(), "-o", file});
  EXPECT_NE(result.exit_code, 0);
  EXPECT_THAT(result.err, HasSubstr("DATA_LOSS"));
  EXPECT_FALSE(std::filesystem::exists(file));
  EXPECT_FALSE(std::filesystem::exists(file + ".tmp"));
}

TEST_F(CliCheckpointsE2eTest, ASha256ThatNamesOtherBytesIsCheckedOnTheServerAndMarkedBad) {
  // The store checks downloads against the crc32c it recorded, which these bytes match; the
  // CLI checks the sha256, since that crc32c is not known to be of the bytes it names, finds
  // the mismatch, downloads again with verify_sha256, and the store marks it BAD.
  const std::string data = Blob(2 << 20, 4);
  const v1::Checkpoint saved = SaveOne(data, 100, Sha256Hex("other bytes"));
  const std::string file = out_.path() + "/claimed.bin";
  RunResult result = Gradhub(*owner_token_, {"checkpoints", "download", saved.name(), "-o", file});
  EXPECT_NE(result.exit_code, 0);
  EXPECT_THAT(result.err, HasSubstr("downloading again, the server checking the sha256 too"));
  EXPECT_THAT(result.err, HasSubstr("marked BAD"));
  EXPECT_FALSE(std::filesystem::exists(file));
  EXPECT_FALSE(std::filesystem::exists(file + ".tmp"));
  auto state = pool_->Exec("SELECT state FROM checkpoints WHERE job_id = $1::uuid", {job_});
  EXPECT_EQ(state->row(0).Get<std::string>("state"), "BAD");
}

// Serves one fixed blob; its first download stops half way with UNAVAILABLE.
class BreakingOnceService final : public v1::CheckpointService::Service {
 public:
  explicit BreakingOnceService(std::string data) : data_(std::move(data)) {}
  grpc::Status DownloadCheckpoint(
      grpc::ServerContext*, const v1::DownloadCheckpointRequest* request,
      grpc::ServerWriter<v1::DownloadCheckpointResponse>* writer) override {
    offsets_.push_back(request->offset());
    const size_t stop = offsets_.size() == 1 ? data_.size() / 2 : data_.size();
    constexpr size_t kChunk = 100000;
    v1::DownloadCheckpointResponse message;
    message.set_sha256(Sha256Hex(data_));
    for (size_t offset = static_cast<size_t>(request->offset()); offset < stop; offset += kChunk) {
      message.set_offset(static_cast<int64_t>(offset));
      message.set_data(data_.substr(offset, std::min(kChunk, stop - offset)));
      writer->Write(message);
      message.clear_sha256();
    }
    if (stop < data_.size()) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "connection reset");
    return grpc::Status::OK;
  }
  std::vector<int64_t> offsets_;

 private:
  const std::string data_;
};

TEST_F(CliCheckpointsE2eTest, ABrokenDownloadResumesFromTheBytesItHas) {
  const std::string data = Blob(1000000, 4);
  BreakingOnceService service(data);
  gradhub::testing::TestGrpcServer server({&service});
  const std::string file = out_.path() + "/resumed.bin";
  RunResult result =
      Gradhub("any",
              {"checkpoints", "download", "jobs/00000000-0000-4000-8000-000000000000/checkpoints/1",
               "-o", file},
              server.address());
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_THAT(result.err, HasSubstr("resuming"));
  EXPECT_EQ(service.offsets_, (std::vector<int64_t>{0, 500000}));
  EXPECT_TRUE(ReadFile(file) == data);
}

}  // namespace
}  // namespace gradhub::checkpoint::testing
