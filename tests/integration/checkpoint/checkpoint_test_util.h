// What the checkpoint store's integration tests share: the rows a checkpoint needs (tenants,
// jobs, attempts) written with plain SQL, so that each test states the exact situation it is
// about; gRPC clients for uploads and downloads; and a fixture with a real PostgreSQL database,
// a LocalBlobStore in a temp dir and a manager.
#pragma once

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "gradhub/v1/checkpoint.grpc.pb.h"
#include "services/checkpoint/blob_scopes.h"
#include "services/checkpoint/checkpoint_manager.h"
#include "services/checkpoint/checkpoint_metrics.h"
#include "services/checkpoint/key_store.h"
#include "services/checkpoint/local_blob_store.h"
#include "services/checkpoint/sealed_blob_store.h"
#include "services/common/auth/authenticator.h"
#include "services/common/crc32c.h"
#include "services/common/sha256.h"
#include "tests/integration/db/db_test_util.h"

namespace gradhub::checkpoint::testing {

inline constexpr char kAdminToken[] = "checkpoint-admin-secret-for-tests";

// Bytes that differ at every position, so an offset error shows in a sha256.
inline std::string Blob(size_t size, int seed = 0) {
  std::string bytes(size, '\0');
  for (size_t i = 0; i < size; ++i)
    bytes[i] = static_cast<char>((i * 167 + seed * 13 + i / 509) & 0xff);
  return bytes;
}

// ---------------------------------------------------------------------------------------------
// Rows.

// A job of `tenant_id` in `state` at `attempt` (its attempts rows included); keep_last 0 leaves
// checkpoint.keepLast out of the spec. Returns the job's id.
inline std::string InsertJob(db::Pool& pool, int64_t tenant_id,
                             const std::string& state = "RUNNING", int attempt = 1,
                             int keep_last = 0) {
  const std::string spec =
      keep_last > 0
          ? "{\"checkpoint\": {\"everySteps\": \"10\", \"keepLast\": " + std::to_string(keep_last) +
                "}}"
          : "{}";
  auto job = pool.Exec(
      "INSERT INTO jobs (tenant_id, spec, world_size, state, current_attempt)"
      " VALUES ($1, $2::jsonb, 2, $3, $4) RETURNING id::text AS id",
      {tenant_id, spec, state, attempt});
  EXPECT_TRUE(job.ok()) << job.status();
  const std::string id = job->row(0).Get<std::string>("id");
  for (int a = 1; a <= attempt; ++a) {
    auto inserted = pool.Exec(
        "INSERT INTO job_attempts (job_id, attempt, rendezvous_prefix, state)"
        " VALUES ($1::uuid, $2::int, $3, CASE WHEN $2::int = $4::int THEN 'RUNNING' ELSE 'FAILED' "
        "END)",
        {id, a, "jobs/" + id + "/attempts/" + std::to_string(a) + "/", attempt});
    EXPECT_TRUE(inserted.ok()) << inserted.status();
  }
  return id;
}

// The job's attempt failed and the next one is SCHEDULED, as the scheduler would do it: the old
// ranks STOPPED, the job RUNNING -> RESTARTING -> SCHEDULED at attempt + 1.
inline void Restart(db::Pool& pool, const std::string& job_id) {
  for (const char* sql :
       {"UPDATE rank_assignments SET state = 'STOPPED' WHERE job_id = $1::uuid",
        "UPDATE job_attempts SET state = 'FAILED' WHERE job_id = $1::uuid",
        "UPDATE jobs SET state = 'RESTARTING' WHERE id = $1::uuid",
        "UPDATE jobs SET state = 'SCHEDULED', current_attempt = current_attempt + 1"
        " WHERE id = $1::uuid",
        "INSERT INTO job_attempts (job_id, attempt, rendezvous_prefix)"
        " SELECT id, current_attempt, 'jobs/' || id || '/attempts/' || current_attempt || '/'"
        " FROM jobs WHERE id = $1::uuid"}) {
    auto done = pool.Exec(sql, {job_id});
    EXPECT_TRUE(done.ok()) << done.status() << " in " << sql;
  }
}

inline std::string JobName(const std::string& job_id) { return "jobs/" + job_id; }

// What an uploaded chunk says of its crc32c: as the trainer does (kSent), nothing, as a client
// that predates the field (kLeftOut), or a wrong one (kWrong: as if the bytes changed on the
// way).
enum class ChunkCrc { kSent, kLeftOut, kWrong };
inline std::optional<uint32_t> CrcOf(std::string_view data, ChunkCrc crc) {
  switch (crc) {
    case ChunkCrc::kSent:
      return Crc32c(data);
    case ChunkCrc::kWrong:
      return Crc32c(data) ^ 1u;
    case ChunkCrc::kLeftOut:
      break;
  }
  return std::nullopt;
}

// ---------------------------------------------------------------------------------------------
// gRPC clients.

struct CallAs {
  std::string token = kAdminToken;
};

inline std::unique_ptr<grpc::ClientContext> Context(const CallAs& as) {
  auto context = std::make_unique<grpc::ClientContext>();
  context->AddMetadata("authorization", "Bearer " + as.token);
  context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  return context;
}

// Streams data[from, to) in chunks of `chunk` bytes; returns the stream's status and, on OK,
// the server's received_bytes in *received.
inline grpc::Status SendChunks(v1::CheckpointService::Stub& stub, const CallAs& as,
                               const std::string& upload_id, const std::string& data, size_t from,
                               size_t to, size_t chunk, int64_t* received = nullptr,
                               ChunkCrc crc = ChunkCrc::kSent) {
  auto context = Context(as);
  v1::UploadChunksResponse response;
  auto writer = stub.UploadChunks(context.get(), &response);
  for (size_t offset = from; offset < to; offset += chunk) {
    v1::UploadChunkRequest request;
    request.set_upload_id(upload_id);
    request.set_offset(static_cast<int64_t>(offset));
    request.set_data(data.substr(offset, std::min(chunk, to - offset)));
    if (const auto sum = CrcOf(request.data(), crc)) request.set_crc32c(*sum);
    if (!writer->Write(request)) break;
  }
  writer->WritesDone();
  grpc::Status status = writer->Finish();
  if (received != nullptr) *received = response.received_bytes();
  return status;
}

// The empty-data probe: how many bytes the server holds of `upload_id`.
inline int64_t Probe(v1::CheckpointService::Stub& stub, const CallAs& as,
                     const std::string& upload_id) {
  auto context = Context(as);
  v1::UploadChunksResponse response;
  auto writer = stub.UploadChunks(context.get(), &response);
  v1::UploadChunkRequest request;
  request.set_upload_id(upload_id);
  writer->Write(request);
  writer->WritesDone();
  const grpc::Status status = writer->Finish();
  EXPECT_TRUE(status.ok()) << status.error_message();
  return status.ok() ? response.received_bytes() : -1;
}

// Downloads `name` from `offset`; the bytes in *data, the announced sha256 in *sha256.
inline grpc::Status Download(v1::CheckpointService::Stub& stub, const CallAs& as,
                             const std::string& name, int64_t offset, std::string* data,
                             std::string* sha256 = nullptr, bool verify_sha256 = false) {
  auto context = Context(as);
  v1::DownloadCheckpointRequest request;
  request.set_name(name);
  request.set_offset(offset);
  request.set_verify_sha256(verify_sha256);
  auto reader = stub.DownloadCheckpoint(context.get(), request);
  v1::DownloadCheckpointResponse message;
  data->clear();
  while (reader->Read(&message)) {
    EXPECT_EQ(message.offset(), offset + static_cast<int64_t>(data->size()));
    if (!message.sha256().empty() && sha256 != nullptr) *sha256 = message.sha256();
    *data += message.data();
  }
  return reader->Finish();
}

// ---------------------------------------------------------------------------------------------
// The fixture.

class CheckpointTest : public db::DatabaseTest {
 protected:
  void SetUp() override {
    db::DatabaseTest::SetUp();
    Migrate();
    pool_ = MakePool(8);
    std::string dir = (std::filesystem::temp_directory_path() / "gradhub-ckpt-XXXXXX").string();
    ASSERT_NE(mkdtemp(dir.data()), nullptr);
    data_dir_ = dir;
    auto blobs = LocalBlobStore::Open(data_dir_);
    ASSERT_TRUE(blobs.ok()) << blobs.status();
    blobs_ = *std::move(blobs);
    auth_ = std::make_unique<api::Authenticator>(pool_.get(), kAdminToken);
    metrics_ = std::make_unique<CheckpointMetrics>(pool_.get());
    NewManager();
    tenant_a_ = *auth_->CreateTenant("team-a", "");
    tenant_b_ = *auth_->CreateTenant("team-b", "");
    token_a_ = auth_->CreateTenantToken("team-a", "")->secret;
    token_b_ = auth_->CreateTenantToken("team-b", "")->secret;
    node_token_ = auth_->CreateNodeToken("")->secret;
  }
  void TearDown() override {
    manager_.reset();
    std::filesystem::remove_all(data_dir_);
  }

  // A manager as after a restart of the server: nothing in memory.
  void NewManager(CheckpointManagerOptions options = {.chunk_size_bytes = 64 << 10}) {
    manager_ = std::make_unique<CheckpointManager>(pool_.get(), store(), metrics_.get(), options);
  }

  // Encryption at rest as gradhub-checkpoint runs it: blobs_ sealed (sealed_blob_store.h)
  // under data keys in PostgreSQL, wrapped by the master key in master_key_file_; a new
  // manager over it. Called again: the sealed store restarts too (its memory is gone).
  void SealBlobs(CheckpointManagerOptions options = {.chunk_size_bytes = 64 << 10}) {
    if (master_ == nullptr) {
      master_key_file_ = data_dir_ + "/master.key";
      absl::StatusOr<MasterKey> master = MasterKey::Create(master_key_file_);
      ASSERT_TRUE(master.ok()) << master.status();
      master_ = std::make_unique<MasterKey>(*std::move(master));
      keys_ = std::make_unique<KeyStore>(pool_.get(), master_.get());
      scopes_ = std::make_unique<CheckpointBlobScopes>(pool_.get());
    }
    manager_.reset();
    sealed_ = std::make_unique<SealedBlobStore>(blobs_.get(), keys_.get(), scopes_.get());
    NewManager(options);
  }
  // What the manager stores in: sealed_ once SealBlobs was called, else the files as they are.
  BlobStore* store() {
    return sealed_ != nullptr ? static_cast<BlobStore*>(sealed_.get()) : blobs_.get();
  }

  Caller As(const std::string& token) {
    auto caller = IdentifyCaller(*auth_, "Bearer " + token);
    EXPECT_TRUE(caller.ok()) << caller.status();
    return *caller;
  }
  Caller Admin() { return As(kAdminToken); }
  // A rank of the job's `attempt`, trainer or script: its job token (IssueRankCredential's).
  Caller Rank(const std::string& job_id, int attempt, int rank = 0) {
    return As(auth_->CreateJobToken(job_id, attempt, rank)->secret);
  }

  absl::StatusOr<std::string> Start(const Caller& caller, const std::string& job_id, int attempt,
                                    int64_t step, int64_t size,
                                    const std::string& request_id = "") {
    v1::StartUploadRequest request;
    request.set_job(JobName(job_id));
    request.set_attempt(attempt);
    request.set_step(step);
    request.set_size_bytes(size);
    request.set_request_id(request_id);
    (*request.mutable_metadata())["format"] = "test";
    auto response = manager_->StartUpload(caller, request);
    if (!response.ok()) return response.status();
    return response->upload_id();
  }

  // Writes data[from, to) in chunks through one writer; the bytes held after the last one.
  absl::StatusOr<int64_t> Write(const Caller& caller, const std::string& upload_id,
                                const std::string& data, size_t from, size_t to,
                                size_t chunk = 64 << 10, ChunkCrc crc = ChunkCrc::kSent) {
    auto writer = manager_->OpenUpload(caller, upload_id);
    if (!writer.ok()) return writer.status();
    for (size_t offset = from; offset < to; offset += chunk) {
      std::string piece = data.substr(offset, std::min(chunk, to - offset));
      const std::optional<uint32_t> sum = CrcOf(piece, crc);
      const absl::Status queued =
          (*writer)->Write(static_cast<int64_t>(offset), std::move(piece), sum);
      if (!queued.ok()) return queued;
    }
    return (*writer)->Finish();
  }

  // One chunk through a writer of its own (an empty one probes); the bytes held afterwards.
  absl::StatusOr<int64_t> WriteOne(const Caller& caller, const std::string& upload_id,
                                   int64_t offset, std::string data,
                                   ChunkCrc crc = ChunkCrc::kSent) {
    auto writer = manager_->OpenUpload(caller, upload_id);
    if (!writer.ok()) return writer.status();
    const std::optional<uint32_t> sum = data.empty() ? std::nullopt : CrcOf(data, crc);
    const absl::Status queued = (*writer)->Write(offset, std::move(data), sum);
    if (!queued.ok()) return queued;
    return (*writer)->Finish();
  }

  absl::StatusOr<v1::Checkpoint> Commit(const Caller& caller, const std::string& upload_id,
                                        const std::string& sha256) {
    v1::CommitCheckpointRequest request;
    request.set_upload_id(upload_id);
    request.set_sha256(sha256);
    return manager_->Commit(caller, request);
  }

  // Start, write all, commit, as the admin; the committed checkpoint. `sha256` as the client
  // claims it (by default that of `data`).
  v1::Checkpoint Save(const std::string& job_id, int attempt, int64_t step, const std::string& data,
                      const std::string& sha256 = "") {
    auto upload = Start(Admin(), job_id, attempt, step, static_cast<int64_t>(data.size()));
    EXPECT_TRUE(upload.ok()) << upload.status();
    auto written = Write(Admin(), *upload, data, 0, data.size());
    EXPECT_TRUE(written.ok()) << written.status();
    auto committed = Commit(Admin(), *upload, sha256.empty() ? Sha256Hex(data) : sha256);
    EXPECT_TRUE(committed.ok()) << committed.status();
    return committed.ok() ? *committed : v1::Checkpoint();
  }

  // A whole download through the manager.
  absl::StatusOr<std::string> ReadAll(const Caller& caller, const std::string& name,
                                      int64_t offset = 0, bool verify_sha256 = false) {
    auto download = manager_->OpenDownload(caller, name, offset, verify_sha256);
    if (!download.ok()) return download.status();
    std::string all, chunk;
    while (true) {
      const absl::Status next = (*download)->Next(&chunk);
      if (!next.ok()) return next;
      if (chunk.empty()) return all;
      all += chunk;
    }
  }

  std::vector<v1::Checkpoint> ListAll(const Caller& caller, const std::string& job_id,
                                      const std::string& filter = "") {
    v1::ListCheckpointsRequest request;
    request.set_parent(JobName(job_id));
    request.set_filter(filter);
    request.set_page_size(1000);
    auto listed = manager_->List(caller, request);
    EXPECT_TRUE(listed.ok()) << listed.status();
    if (!listed.ok()) return {};
    return {listed->checkpoints().begin(), listed->checkpoints().end()};
  }

  // The blob of a checkpoint on disk.
  std::string BlobPathOf(const v1::Checkpoint& checkpoint) {
    auto row = pool_->Exec(
        "SELECT blob_path FROM checkpoints WHERE job_id = $1::uuid AND step = $2"
        " ORDER BY id DESC LIMIT 1",
        {checkpoint.job().substr(5), checkpoint.step()});
    EXPECT_TRUE(row.ok() && !row->empty());
    return blobs_->BlobPath(row->row(0).Get<std::string>("blob_path"));
  }

  // Changes one byte of a file in place, as a failing disk would.
  static void FlipByte(const std::string& path, int64_t offset) {
    std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
    ASSERT_TRUE(file.good()) << path;
    file.seekg(offset);
    char byte = 0;
    file.read(&byte, 1);
    byte = static_cast<char>(byte ^ 0x5a);
    file.seekp(offset);
    file.write(&byte, 1);
  }

  int64_t Count(const std::string& sql, std::vector<db::Param> params = {}) {
    auto rows = pool_->Exec(sql, params);
    EXPECT_TRUE(rows.ok()) << rows.status();
    return rows.ok() ? rows->row(0).Get<int64_t>("n") : -1;
  }

  std::unique_ptr<db::Pool> pool_;
  std::string data_dir_;
  std::unique_ptr<LocalBlobStore> blobs_;
  // Encryption at rest, once SealBlobs was called.
  std::string master_key_file_;
  std::unique_ptr<MasterKey> master_;
  std::unique_ptr<KeyStore> keys_;
  std::unique_ptr<CheckpointBlobScopes> scopes_;
  std::unique_ptr<SealedBlobStore> sealed_;
  std::unique_ptr<api::Authenticator> auth_;
  std::unique_ptr<CheckpointMetrics> metrics_;
  std::unique_ptr<CheckpointManager> manager_;
  int64_t tenant_a_ = 0, tenant_b_ = 0;
  std::string token_a_, token_b_, node_token_;
};

}  // namespace gradhub::checkpoint::testing
