// The code store (code_store.h) as clients use it: CodeService over real gRPC on loopback and
// its REST routes over real HTTP on the checkpoint store's listener, with real PostgreSQL, a
// LocalBlobStore in a temp dir, and archives written by Python's tarfile (not by our packer).
// Every refusal is checked to keep nothing: no row, no blob, no upload file left behind.
#include "services/checkpoint/code_store.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <malloc.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "gradhub/v1/code.grpc.pb.h"
#include "services/checkpoint/checkpoint_rest.h"
#include "services/checkpoint/code_rest.h"
#include "services/checkpoint/code_service.h"
#include "tests/integration/checkpoint/checkpoint_test_util.h"
#include "tests/support/grpc_test_server.h"
#include "tests/support/subprocess.h"

namespace gradhub::checkpoint::testing {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

constexpr size_t kMessageBytes = 1 << 20;

// A tar written by Python's tarfile (PAX format). `entries` is Python that calls
// add(name, data=b'', type=tarfile.REGTYPE, linkname='', **attributes) for each entry.
std::string PythonTar(const std::string& entries) {
  const gradhub::testing::TempDir dir;
  const std::string path = dir.path() + "/code.tar";
  const std::string script = R"(import io, random, sys, tarfile
t = tarfile.open(sys.argv[1], 'w', format=tarfile.PAX_FORMAT)
def add(name, data=b'', type=tarfile.REGTYPE, linkname='', **attributes):
    info = tarfile.TarInfo(name)
    info.type, info.linkname = type, linkname
    for key, value in attributes.items(): setattr(info, key, value)
    info.size = len(data) if type == tarfile.REGTYPE else 0
    t.addfile(info, io.BytesIO(data) if type == tarfile.REGTYPE else None)
)" + entries + "\nt.close()\n";
  const gradhub::testing::RunResult made =
      gradhub::testing::Run({"/usr/bin/python3", "-c", script, path});
  EXPECT_EQ(made.exit_code, 0) << made.err;
  std::ifstream file(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(file), {});
}

std::string GoodTar() {
  return PythonTar(
      "add('train.py', b'import torch\\nprint(1)\\n', mode=0o755)\n"
      "add('pkg', type=tarfile.DIRTYPE)\n"
      "add('pkg/__init__.py')\n"
      "add('pkg/model.py', bytes(range(256)) * 40)\n"
      "add('latest', type=tarfile.SYMTYPE, linkname='pkg/model.py')\n");
}

class CodeStoreTest : public CheckpointTest {
 protected:
  void SetUp() override {
    CheckpointTest::SetUp();
    NewStore({});
    ASSERT_TRUE(auth_->CreateTenant("team-c", "").ok());
    tenant_c_token_ = auth_->CreateTenantToken("team-c", "")->secret;
  }
  void TearDown() override {
    rest_.reset();  // its loop stopped first: the code routes run on it
    code_rest_.reset();
    server_.reset();
    service_.reset();
    store_.reset();
    CheckpointTest::TearDown();
  }

  // A store (and its gRPC service) with `limits`, as a server started with those flags.
  void NewStore(code::ArchiveLimits limits) {
    server_.reset();
    service_.reset();
    store_ = std::make_unique<CodeStore>(
        pool_.get(), blobs_.get(), &manager_->transfer_slots(), metrics_.get(),
        CodeStoreOptions{.limits = limits,
                         .log = [this](const std::string& line) { logged_.push_back(line); }});
    service_ = std::make_unique<CodeService>(store_.get(), auth_.get(), metrics_.get());
    server_ = std::make_unique<gradhub::testing::TestGrpcServer>(
        std::vector<grpc::Service*>{service_.get()},
        gradhub::testing::TestGrpcServerOptions{.max_message_bytes = 5 << 20});
    stub_ = v1::CodeService::NewStub(server_->NewChannel());
  }

  // REST on the checkpoint store's listener, as main.cc serves it.
  std::unique_ptr<httplib::Client> StartRest() {
    rest_ = std::make_unique<CheckpointRest>(manager_.get(), auth_.get(), metrics_.get());
    code_rest_ =
        std::make_unique<CodeRest>(rest_->http_server(), store_.get(), auth_.get(), metrics_.get());
    const absl::StatusOr<int> port = rest_->Start("127.0.0.1", 0);
    EXPECT_TRUE(port.ok()) << port.status();
    return std::make_unique<httplib::Client>("127.0.0.1", *port);
  }

  struct Uploaded {
    grpc::Status status;
    v1::CodeArchive archive;
  };
  // `bytes` in messages of `chunk` bytes after a header with `size` (-1: the bytes' size) and
  // `sha256`.
  Uploaded Upload(const std::string& token, const std::string& bytes, int64_t size = -1,
                  const std::string& sha256 = "", size_t chunk = kMessageBytes) {
    auto context = Context({token});
    Uploaded uploaded;
    auto writer = stub_->UploadCode(context.get(), &uploaded.archive);
    v1::UploadCodeRequest message;
    message.mutable_header()->set_size_bytes(size < 0 ? static_cast<int64_t>(bytes.size()) : size);
    message.mutable_header()->set_sha256(sha256);
    bool open = writer->Write(message);
    for (size_t at = 0; open && at < bytes.size(); at += chunk) {
      message.mutable_data()->assign(bytes, at, chunk);
      open = writer->Write(message);
    }
    writer->WritesDone();
    uploaded.status = writer->Finish();
    return uploaded;
  }

  grpc::Status Get(const std::string& token, const std::string& name, v1::CodeArchive* archive) {
    auto context = Context({token});
    v1::GetCodeRequest request;
    request.set_name(name);
    return stub_->GetCode(context.get(), request, archive);
  }

  grpc::Status Download(const std::string& token, const std::string& name, int64_t offset,
                        std::string* data) {
    auto context = Context({token});
    v1::DownloadCodeRequest request;
    request.set_name(name);
    request.set_offset(offset);
    auto reader = stub_->DownloadCode(context.get(), request);
    v1::DownloadCodeResponse message;
    data->clear();
    while (reader->Read(&message)) {
      EXPECT_LE(message.data().size(), kCodeDownloadChunkBytes);
      *data += message.data();
    }
    return reader->Finish();
  }

  std::string BlobPathOf(const std::string& sha256) {
    return blobs_->BlobPath(CodeBlobKey(sha256));
  }
  int64_t Rows(const std::string& sha256) {
    return Count("SELECT count(*) AS n FROM code_archives WHERE sha256 = $1", {sha256});
  }
  // Files the code store has in the blob store's uploads.
  int UploadFiles() {
    int files = 0;
    for (const auto& entry : fs::directory_iterator(data_dir_ + "/uploads")) {
      files += entry.path().filename().string().rfind(kCodeUploadPrefix, 0) == 0;
    }
    return files;
  }
  void ExpectNothingKept(const std::string& bytes) {
    EXPECT_EQ(Rows(Sha256Hex(bytes)), 0);
    EXPECT_FALSE(fs::exists(BlobPathOf(Sha256Hex(bytes))));
    EXPECT_EQ(UploadFiles(), 0);
    EXPECT_EQ(manager_->transfer_slots().in_progress(), 0);
  }
  // Waits until the server has let go of a broken stream.
  void WaitForTransfers() {
    for (int i = 0; i < 500 && manager_->transfer_slots().in_progress() > 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }

  std::unique_ptr<CodeStore> store_;
  std::unique_ptr<CodeService> service_;
  std::unique_ptr<gradhub::testing::TestGrpcServer> server_;
  std::unique_ptr<v1::CodeService::Stub> stub_;
  std::unique_ptr<CheckpointRest> rest_;
  std::unique_ptr<CodeRest> code_rest_;
  std::string tenant_c_token_;
  std::vector<std::string> logged_;
};

TEST_F(CodeStoreTest, AnUploadIsKeptOnceAndReadBackBitForBit) {
  const std::string tar = GoodTar();
  const std::string sha256 = Sha256Hex(tar);
  const Uploaded uploaded = Upload(token_a_, tar, -1, sha256, 1000);
  ASSERT_TRUE(uploaded.status.ok()) << uploaded.status.error_message();
  EXPECT_EQ(uploaded.archive.name(), "code/" + sha256);
  EXPECT_EQ(uploaded.archive.digest(), "sha256:" + sha256);
  EXPECT_EQ(uploaded.archive.size_bytes(), static_cast<int64_t>(tar.size()));
  EXPECT_EQ(uploaded.archive.unpacked_bytes(), 22 + 256 * 40);
  EXPECT_EQ(uploaded.archive.entries(), 5);
  EXPECT_TRUE(fs::exists(BlobPathOf(sha256)));
  EXPECT_EQ(UploadFiles(), 0);

  for (const std::string& name : {"code/" + sha256, "sha256:" + sha256}) {
    v1::CodeArchive got;
    ASSERT_TRUE(Get(token_a_, name, &got).ok()) << name;
    EXPECT_EQ(got.SerializeAsString(), uploaded.archive.SerializeAsString());
  }
  std::string data;
  ASSERT_TRUE(Download(token_a_, "sha256:" + sha256, 0, &data).ok());
  EXPECT_TRUE(data == tar);
  ASSERT_TRUE(Download(token_a_, uploaded.archive.name(), 1234, &data).ok());
  EXPECT_TRUE(data == tar.substr(1234));
  ASSERT_TRUE(Download(token_a_, uploaded.archive.name(), tar.size(), &data).ok());
  EXPECT_TRUE(data.empty());
  EXPECT_EQ(Download(token_a_, uploaded.archive.name(), tar.size() + 1, &data).error_code(),
            grpc::StatusCode::OUT_OF_RANGE);
  EXPECT_EQ(manager_->transfer_slots().in_progress(), 0);
}

TEST_F(CodeStoreTest, TheSameBytesTwiceAreOneBlobAndTheSameAnswer) {
  const std::string tar = GoodTar();
  const Uploaded first = Upload(token_a_, tar);
  ASSERT_TRUE(first.status.ok()) << first.status.error_message();
  const auto blob_time = fs::last_write_time(BlobPathOf(Sha256Hex(tar)));
  const Uploaded second = Upload(token_a_, tar, -1, Sha256Hex(tar));
  ASSERT_TRUE(second.status.ok()) << second.status.error_message();
  EXPECT_EQ(second.archive.SerializeAsString(), first.archive.SerializeAsString());
  EXPECT_EQ(Rows(Sha256Hex(tar)), 1);
  EXPECT_EQ(fs::last_write_time(BlobPathOf(Sha256Hex(tar))), blob_time);  // the first one kept
  EXPECT_EQ(std::distance(fs::directory_iterator(data_dir_ + "/blobs/code"), {}), 1);
  EXPECT_EQ(UploadFiles(), 0);
}

TEST_F(CodeStoreTest, EachTenantSeesItsOwnRowAndNoOneElses) {
  const std::string tar = GoodTar();
  const Uploaded a = Upload(token_a_, tar);
  ASSERT_TRUE(a.status.ok()) << a.status.error_message();
  v1::CodeArchive got;
  EXPECT_EQ(Get(token_b_, a.archive.name(), &got).error_code(), grpc::StatusCode::NOT_FOUND);
  const Uploaded b = Upload(token_b_, tar);
  ASSERT_TRUE(b.status.ok()) << b.status.error_message();
  EXPECT_EQ(Rows(Sha256Hex(tar)), 2);
  EXPECT_TRUE(Get(token_a_, a.archive.name(), &got).ok());
  EXPECT_TRUE(Get(token_b_, a.archive.name(), &got).ok());
  const grpc::Status other = Get(tenant_c_token_, a.archive.name(), &got);
  EXPECT_EQ(other.error_code(), grpc::StatusCode::NOT_FOUND);
  std::string data;
  EXPECT_EQ(Download(tenant_c_token_, a.archive.name(), 0, &data).error_code(),
            grpc::StatusCode::NOT_FOUND);
  EXPECT_TRUE(data.empty());
}

TEST_F(CodeStoreTest, NodesAndTheAdminReadAnyArchiveButOnlyTenantsUpload) {
  const std::string tar = GoodTar();
  const Uploaded a = Upload(token_a_, tar);
  ASSERT_TRUE(a.status.ok()) << a.status.error_message();
  std::string data;
  ASSERT_TRUE(Download(node_token_, a.archive.digest(), 0, &data).ok());
  EXPECT_TRUE(data == tar);
  v1::CodeArchive got;
  EXPECT_TRUE(Get(kAdminToken, a.archive.name(), &got).ok());

  const std::string job = InsertJob(*pool_, tenant_a_);
  const std::string job_token = auth_->CreateJobToken(job, 1, 0)->secret;
  for (const std::string& token : {std::string(kAdminToken), node_token_, job_token}) {
    const Uploaded refused = Upload(token, tar);
    EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
    EXPECT_THAT(refused.status.error_message(), HasSubstr("use a tenant token"));
  }
  // Script ranks read nothing either, their own tenant's code included.
  EXPECT_EQ(Get(job_token, a.archive.name(), &got).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(Get("ghk_not-a-token", a.archive.name(), &got).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Rows(Sha256Hex(tar)), 1);
}

TEST_F(CodeStoreTest, AHostileArchiveIsRefusedNamingItsEntryAndNothingIsKept) {
  const std::string good = "add('ok.py', b'x = 1\\n')\n";
  for (const auto& [entries, entry] : std::vector<std::pair<std::string, std::string>>{
           {good + "add('../evil', b'boom')", "../evil"},
           {good + "add('etc', type=tarfile.SYMTYPE, linkname='/etc')", "etc"},
           {good + "add('null', type=tarfile.CHRTYPE, devmajor=1, devminor=3)", "null"},
           {good + "add('/abs.py', b'x')", "/abs.py"},
           {good + "add('hard', type=tarfile.LNKTYPE, linkname='ok.py')", "hard"}}) {
    const std::string tar = PythonTar(entries);
    const Uploaded refused = Upload(token_a_, tar);
    EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << entry;
    EXPECT_THAT(refused.status.error_message(), HasSubstr("\"" + entry + "\"")) << entry;
    ExpectNothingKept(tar);
  }
}

TEST_F(CodeStoreTest, ABadHeaderIsRefusedBeforeTheBytesAndNothingIsKept) {
  NewStore({.max_archive_bytes = 1 << 20});
  // Only the header goes out: the answer comes without a byte of data.
  auto context = Context({token_a_});
  v1::CodeArchive archive;
  auto writer = stub_->UploadCode(context.get(), &archive);
  v1::UploadCodeRequest header;
  header.mutable_header()->set_size_bytes((1 << 20) + 1);
  ASSERT_TRUE(writer->Write(header));
  const grpc::Status over = writer->Finish();
  EXPECT_EQ(over.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(over.error_message(), HasSubstr("--max-code-bytes"));
  EXPECT_THAT(over.error_message(), HasSubstr("1048576"));
  EXPECT_EQ(UploadFiles(), 0);

  const std::string tar = GoodTar();
  const Uploaded bad_sha = Upload(token_a_, tar, -1, "12ab");
  EXPECT_EQ(bad_sha.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(bad_sha.status.error_message(), HasSubstr("sha256"));
  // Data before the header.
  auto data_first = Context({token_a_});
  auto data_writer = stub_->UploadCode(data_first.get(), &archive);
  v1::UploadCodeRequest data;
  data.set_data(tar);
  data_writer->Write(data);
  data_writer->WritesDone();
  EXPECT_EQ(data_writer->Finish().error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  ExpectNothingKept(tar);
}

TEST_F(CodeStoreTest, BytesThatDifferFromTheHeaderAreDataLossAndNothingIsKept) {
  const std::string tar = GoodTar();
  const Uploaded wrong_sha = Upload(token_a_, tar, -1, Sha256Hex("other bytes"));
  EXPECT_EQ(wrong_sha.status.error_code(), grpc::StatusCode::DATA_LOSS);
  EXPECT_THAT(wrong_sha.status.error_message(), HasSubstr(Sha256Hex(tar)));
  ExpectNothingKept(tar);
  const Uploaded fewer = Upload(token_a_, tar, static_cast<int64_t>(tar.size()) + 512);
  EXPECT_EQ(fewer.status.error_code(), grpc::StatusCode::DATA_LOSS);
  ExpectNothingKept(tar);
  const Uploaded more = Upload(token_a_, tar, static_cast<int64_t>(tar.size()) - 512);
  EXPECT_EQ(more.status.error_code(), grpc::StatusCode::DATA_LOSS);
  EXPECT_THAT(more.status.error_message(), HasSubstr("size_bytes"));
  ExpectNothingKept(tar);
}

TEST_F(CodeStoreTest, ABrokenUploadStreamLeavesNothing) {
  const std::string tar = PythonTar("add('big.bin', random.Random(3).randbytes(8 << 20))");
  {
    auto context = Context({token_a_});
    v1::CodeArchive archive;
    auto writer = stub_->UploadCode(context.get(), &archive);
    v1::UploadCodeRequest message;
    message.mutable_header()->set_size_bytes(static_cast<int64_t>(tar.size()));
    ASSERT_TRUE(writer->Write(message));
    for (int i = 0; i < 2; ++i) {
      message.set_data(tar.substr(i * (3 << 20), 3 << 20));
      ASSERT_TRUE(writer->Write(message));
    }
    // Until the server has written some of it, then the client goes away.
    for (int i = 0; i < 500 && UploadFiles() == 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_EQ(UploadFiles(), 1);
    context->TryCancel();
    EXPECT_FALSE(writer->Finish().ok());
  }
  WaitForTransfers();
  ExpectNothingKept(tar);
}

TEST_F(CodeStoreTest, RestUploadsReadsAndServesRanges) {
  const std::unique_ptr<httplib::Client> client = StartRest();
  const httplib::Headers a = {{"Authorization", "Bearer " + token_a_}};
  const std::string tar = GoodTar(), sha256 = Sha256Hex(tar);
  httplib::Headers with_sha = a;
  with_sha.emplace("X-Code-Sha256", sha256);
  auto put = client->Put("/v1/code", with_sha, tar, "application/x-tar");
  ASSERT_TRUE(put);
  ASSERT_EQ(put->status, 200) << put->body;
  EXPECT_THAT(put->body, HasSubstr("\"name\":\"code/" + sha256 + "\""));
  EXPECT_THAT(put->body, HasSubstr("\"entries\":5"));

  auto got = client->Get(("/v1/code/" + sha256).c_str(), a);
  ASSERT_EQ(got->status, 200) << got->body;
  EXPECT_THAT(got->body, HasSubstr("\"digest\":\"sha256:" + sha256 + "\""));
  EXPECT_EQ(client
                ->Get(("/v1/code/" + sha256).c_str(),
                      httplib::Headers{{"Authorization", "Bearer " + token_b_}})
                ->status,
            404);
  const std::string download = "/v1/code/" + sha256 + ":download";
  auto whole = client->Get(download.c_str(), a);
  ASSERT_EQ(whole->status, 200) << whole->body;
  EXPECT_EQ(whole->get_header_value("X-Code-Sha256"), sha256);
  EXPECT_TRUE(whole->body == tar);
  httplib::Headers ranged = a;
  ranged.emplace("Range", "bytes=1000-");
  auto tail = client->Get(download.c_str(), ranged);
  ASSERT_EQ(tail->status, 206) << tail->body;
  EXPECT_EQ(tail->get_header_value("Content-Range"),
            absl::StrCat("bytes 1000-", tar.size() - 1, "/", tar.size()));
  EXPECT_TRUE(tail->body == tar.substr(1000));
  httplib::Headers past = a;
  past.emplace("Range", absl::StrCat("bytes=", tar.size(), "-"));
  EXPECT_EQ(client->Get(download.c_str(), past)->status, 416);
  httplib::Headers closed = a;
  closed.emplace("Range", "bytes=0-99");
  EXPECT_EQ(client->Get(download.c_str(), closed)->status, 416);
  EXPECT_EQ(client->Get("/v1/code/not-a-digest", a)->status, 400);
}

TEST_F(CodeStoreTest, RestRefusesWhatGrpcRefuses) {
  const std::unique_ptr<httplib::Client> client = StartRest();
  const httplib::Headers a = {{"Authorization", "Bearer " + token_a_}};
  const std::string hostile = PythonTar("add('../evil', b'x')");
  auto refused = client->Put("/v1/code", a, hostile, "application/x-tar");
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 400);
  EXPECT_THAT(refused->body, HasSubstr("../evil"));
  ExpectNothingKept(hostile);

  const std::string tar = GoodTar();
  httplib::Headers wrong = a;
  wrong.emplace("X-Code-Sha256", Sha256Hex("other"));
  auto mismatch = client->Put("/v1/code", wrong, tar, "application/x-tar");
  EXPECT_EQ(mismatch->status, 500);
  EXPECT_THAT(mismatch->body, HasSubstr("DATA_LOSS"));
  auto as_node =
      client->Put("/v1/code", httplib::Headers{{"Authorization", "Bearer " + node_token_}}, tar,
                  "application/x-tar");
  EXPECT_EQ(as_node->status, 403);
  // A chunked body has no Content-Length.
  auto chunked = client->Put(
      "/v1/code", a,
      [&](size_t offset, httplib::DataSink& sink) {
        if (offset == 0) sink.write(tar.data(), tar.size());
        sink.done();
        return true;
      },
      "application/x-tar");
  EXPECT_EQ(chunked->status, 411);
  ExpectNothingKept(tar);
}

TEST_F(CodeStoreTest, ACorruptOrMissingBlobIsRemovedWithItsRowsAndCanBeUploadedAgain) {
  const std::string tar = GoodTar(), sha256 = Sha256Hex(tar);
  ASSERT_TRUE(Upload(token_a_, tar).status.ok());
  ASSERT_TRUE(Upload(token_b_, tar).status.ok());
  FlipByte(BlobPathOf(sha256), 700);
  std::string data;
  const grpc::Status corrupt = Download(node_token_, "code/" + sha256, 0, &data);
  EXPECT_EQ(corrupt.error_code(), grpc::StatusCode::DATA_LOSS);
  EXPECT_LT(data.size(), tar.size());  // the last chunk never went out
  EXPECT_EQ(Rows(sha256), 0);
  EXPECT_FALSE(fs::exists(BlobPathOf(sha256)));
  ASSERT_EQ(logged_.size(), 1u);
  EXPECT_THAT(logged_[0], HasSubstr("code/" + sha256));
  v1::CodeArchive got;
  EXPECT_EQ(Get(token_a_, "code/" + sha256, &got).error_code(), grpc::StatusCode::NOT_FOUND);

  ASSERT_TRUE(Upload(token_a_, tar).status.ok());
  ASSERT_TRUE(Download(token_a_, "code/" + sha256, 0, &data).ok());
  EXPECT_TRUE(data == tar);
  fs::remove(BlobPathOf(sha256));
  EXPECT_EQ(Download(token_a_, "code/" + sha256, 0, &data).error_code(),
            grpc::StatusCode::DATA_LOSS);
  EXPECT_EQ(Rows(sha256), 0);
}

TEST_F(CodeStoreTest, TheScrubRemovesWhatNoLongerMatchesAndKeepsTheRest) {
  const std::string good = GoodTar(), bad = PythonTar("add('b.py', b'b = 2\\n')");
  ASSERT_TRUE(Upload(token_a_, good).status.ok());
  ASSERT_TRUE(Upload(token_a_, bad).status.ok());
  FlipByte(BlobPathOf(Sha256Hex(bad)), 600);
  const absl::StatusOr<CodeScrubReport> report = store_->Scrub();
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->checked, 2);
  ASSERT_EQ(report->corrupt.size(), 1u);
  EXPECT_THAT(report->corrupt[0], HasSubstr(Sha256Hex(bad)));
  EXPECT_EQ(Rows(Sha256Hex(bad)), 0);
  EXPECT_FALSE(fs::exists(BlobPathOf(Sha256Hex(bad))));
  EXPECT_EQ(Rows(Sha256Hex(good)), 1);
  EXPECT_TRUE(fs::exists(BlobPathOf(Sha256Hex(good))));
}

TEST_F(CodeStoreTest, CleanupsRemoveOnlyWhatNoRowNeeds) {
  const std::string tar = GoodTar();
  ASSERT_TRUE(Upload(token_a_, tar).status.ok());
  // A blob whose row never came (a crash), and an upload of a previous life.
  const std::string orphan = std::string(64, 'a');
  ASSERT_TRUE(blobs_->Append("code-leftover", 0, "partial").ok());
  ASSERT_TRUE(blobs_->Append("code-orphan", 0, "bytes").ok());
  ASSERT_TRUE(blobs_->Commit("code-orphan", CodeBlobKey(orphan)).ok());
  ASSERT_TRUE(blobs_->Append("code-fresh", 0, "being written").ok());
  fs::last_write_time(blobs_->UploadPath("code-leftover"),
                      fs::file_time_type::clock::now() - std::chrono::hours(2));

  // The checkpoints' cleanup leaves the code store's keys alone.
  ASSERT_TRUE(manager_->Cleanup().ok());
  EXPECT_TRUE(fs::exists(BlobPathOf(Sha256Hex(tar))));
  EXPECT_TRUE(fs::exists(BlobPathOf(orphan)));
  EXPECT_EQ(UploadFiles(), 2);

  const absl::StatusOr<CodeCleanupReport> report = store_->Cleanup();
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->orphan_blobs, 1);
  EXPECT_EQ(report->stale_uploads, 1);
  EXPECT_FALSE(fs::exists(BlobPathOf(orphan)));
  EXPECT_TRUE(fs::exists(BlobPathOf(Sha256Hex(tar))));
  EXPECT_TRUE(fs::exists(blobs_->UploadPath("code-fresh")));  // written to within the TTL
}

TEST_F(CodeStoreTest, UploadsAndDownloadsTakeTheCheckpointsTransferSlots) {
  const std::string tar = GoodTar();
  ASSERT_TRUE(Upload(token_a_, tar).status.ok());
  std::vector<std::unique_ptr<CheckpointDownload>> held;
  const std::string job = InsertJob(*pool_, tenant_a_);
  const v1::Checkpoint saved = Save(job, 1, 10, Blob(1000));
  for (int i = 0; i < CheckpointManagerOptions().max_transfers_per_caller; ++i) {
    auto download = manager_->OpenDownload(As(token_a_), saved.name(), 0);
    ASSERT_TRUE(download.ok()) << download.status();
    held.push_back(*std::move(download));
  }
  EXPECT_EQ(Upload(token_a_, tar).status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  std::string data;
  EXPECT_EQ(Download(token_a_, "code/" + Sha256Hex(tar), 0, &data).error_code(),
            grpc::StatusCode::RESOURCE_EXHAUSTED);
  // Another caller's slots are its own.
  EXPECT_TRUE(Upload(token_b_, tar).status.ok());
  EXPECT_TRUE(Download(token_b_, "code/" + Sha256Hex(tar), 0, &data).ok());
}

// The issue's target: an upload at least half as fast as dd of the same bytes. Printed, not
// asserted (a loaded CI machine varies too much); tests/bench measures it properly.
TEST_F(CodeStoreTest, ReportsTheUploadThroughputOf64MiBOverLoopbackGrpc) {
  // As gradhub-checkpoint's main does: message buffers stay in the heap instead of coming fresh
  // (and page-faulted) from the kernel for every message.
  ASSERT_EQ(mallopt(M_MMAP_THRESHOLD, 32 << 20), 1);
  ASSERT_EQ(mallopt(M_TRIM_THRESHOLD, 256 << 20), 1);
  const std::string tar = PythonTar("add('weights.bin', random.Random(7).randbytes(64 << 20))");
  const gradhub::testing::TempDir dir;
  {
    std::ofstream file(dir.path() + "/code.tar", std::ios::binary);
    file.write(tar.data(), static_cast<std::streamsize>(tar.size()));
  }
  const auto dd_start = std::chrono::steady_clock::now();
  const gradhub::testing::RunResult dd =
      gradhub::testing::Run({"/usr/bin/dd", "if=" + dir.path() + "/code.tar",
                             "of=" + data_dir_ + "/dd-copy", "bs=4M", "conv=fsync"});
  const double dd_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - dd_start).count();
  ASSERT_EQ(dd.exit_code, 0) << dd.err;
  const auto start = std::chrono::steady_clock::now();
  const Uploaded uploaded = Upload(token_a_, tar, -1, Sha256Hex(tar), 4 << 20);
  const double upload_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(uploaded.status.ok()) << uploaded.status.error_message();
  const double mb = static_cast<double>(tar.size()) / 1e6;
  std::printf(
      "64 MiB code upload over loopback gRPC: %.3f s (%.0f MB/s); dd conv=fsync: %.3f s "
      "(%.0f MB/s); upload/dd = %.2f\n",
      upload_s, mb / upload_s, dd_s, mb / dd_s, dd_s / upload_s);
}

}  // namespace
}  // namespace gradhub::checkpoint::testing
