#include "services/checkpoint/checkpoint_manager.h"

#include <algorithm>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "services/common/crc32c.h"
#include "services/common/db/migrator.h"
#include "services/common/job_records.h"
#include "services/common/page_token.h"
#include "services/common/status_macros.h"
#include "services/common/text_rules.h"

namespace gradhub::checkpoint {

namespace {

constexpr size_t kMaxRequestIdLength = 64;
constexpr int kMaxMetadataEntries = 64;
constexpr size_t kMaxMetadataBytes = 16 << 10;

absl::Status ValidateStart(const v1::StartUploadRequest& request) {
  std::string problems;
  if (request.attempt() < 1) absl::StrAppend(&problems, " attempt: must be at least 1;");
  if (request.step() < 0) absl::StrAppend(&problems, " step: must not be negative;");
  if (request.size_bytes() < 0) absl::StrAppend(&problems, " size_bytes: must not be negative;");
  if (const std::string problem = TextLimitProblem(request.request_id(), kMaxRequestIdLength);
      !problem.empty()) {
    absl::StrAppend(&problems, " request_id: ", problem, ";");
  }
  size_t metadata_bytes = 0;
  bool metadata_text_ok = true;  // stored as jsonb, which holds no NUL (text_rules.h)
  for (const auto& [key, value] : request.metadata()) {
    metadata_bytes += key.size() + value.size();
    metadata_text_ok = metadata_text_ok && TextProblem(key).empty() && TextProblem(value).empty();
  }
  if (request.metadata_size() > kMaxMetadataEntries || metadata_bytes > kMaxMetadataBytes) {
    absl::StrAppend(&problems, " metadata: at most ", kMaxMetadataEntries, " entries and ",
                    kMaxMetadataBytes, " bytes;");
  }
  if (!metadata_text_ok) {
    absl::StrAppend(&problems, " metadata: a key or value holds a NUL character or is not UTF-8;");
  }
  if (problems.empty()) return absl::OkStatus();
  problems.pop_back();
  return absl::InvalidArgumentError(absl::StrCat("invalid upload:", problems));
}

std::string MetadataJson(const google::protobuf::Map<std::string, std::string>& metadata) {
  nlohmann::json json = nlohmann::json::object();
  for (const auto& [key, value] : metadata) json[key] = value;
  return json.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

absl::StatusOr<std::optional<CheckpointRow>> FindByRequestId(db::Transaction& tx,
                                                             const std::string& job_id,
                                                             const std::string& request_id) {
  GRADHUB_ASSIGN_OR_RETURN(
      db::Result rows, tx.Exec(absl::StrCat("SELECT ", kCheckpointColumns, " FROM checkpoints c",
                                            " WHERE c.job_id = $1::uuid AND c.request_id = $2"),
                               {job_id, request_id}));
  if (rows.empty()) return std::nullopt;
  GRADHUB_ASSIGN_OR_RETURN(CheckpointRow row, CheckpointFromRow(rows.row(0)));
  return row;
}

// The row of a retried StartUpload, or ALREADY_EXISTS when the request_id named another upload.
absl::StatusOr<CheckpointRow> SameUpload(const CheckpointRow& row,
                                         const v1::StartUploadRequest& request) {
  if (row.attempt != request.attempt() || row.step != request.step() ||
      row.size_bytes != request.size_bytes()) {
    return absl::AlreadyExistsError(absl::StrCat(
        "request_id '", request.request_id(), "' was used for another upload (attempt ",
        row.attempt, ", step ", row.step, ", ", row.size_bytes, " bytes)"));
  }
  return row;
}

// Step 1 in `tx`, once the caller may upload: the upload's row, new or that of a retry.
absl::StatusOr<CheckpointRow> InsertUpload(db::Transaction& tx, const std::string& job_id,
                                           const v1::StartUploadRequest& request) {
  const std::string& request_id = request.request_id();
  if (!request_id.empty()) {
    GRADHUB_ASSIGN_OR_RETURN(auto earlier, FindByRequestId(tx, job_id, request_id));
    if (earlier) return SameUpload(*earlier, request);
  }
  GRADHUB_ASSIGN_OR_RETURN(db::Result committed,
                           tx.Exec("SELECT 1 FROM checkpoints WHERE job_id = $1::uuid AND step = $2"
                                   " AND state = 'COMMITTED'",
                                   {job_id, request.step()}));
  if (!committed.empty()) {
    return absl::AlreadyExistsError(absl::StrCat("jobs/", job_id,
                                                 " already has a committed "
                                                 "checkpoint at step ",
                                                 request.step()));
  }
  // The blob key embeds the upload id, so both come from one generated value.
  GRADHUB_ASSIGN_OR_RETURN(
      db::Result inserted,
      tx.Exec(absl::StrCat(
                  "WITH fresh AS (SELECT gen_random_uuid() AS upload_id, $1::uuid AS job_id,"
                  "   $3::bigint AS step)"
                  " INSERT INTO checkpoints AS c (job_id, attempt, step, size_bytes, metadata,"
                  "   request_id, upload_id, blob_path)"
                  " SELECT fresh.job_id, $2, fresh.step, $4, $5::jsonb, nullif($6, ''),"
                  "   fresh.upload_id,"
                  "   fresh.job_id::text || '/' || fresh.step::text || '-' || fresh.upload_id::text"
                  " FROM fresh"
                  " ON CONFLICT (job_id, request_id) DO NOTHING RETURNING ",
                  kCheckpointColumns),
              {job_id, request.attempt(), request.step(), request.size_bytes(),
               MetadataJson(request.metadata()), request_id}));
  if (!inserted.empty()) return CheckpointFromRow(inserted.row(0));
  // A concurrent call with the same request_id inserted first; this statement saw it commit.
  GRADHUB_ASSIGN_OR_RETURN(auto concurrent, FindByRequestId(tx, job_id, request_id));
  if (!concurrent) return absl::AbortedError("concurrent StartUpload; try again");
  return SameUpload(*concurrent, request);
}

absl::Status UploadNotFound(const std::string& upload_id) {
  return absl::NotFoundError(absl::StrCat("upload '", upload_id, "' not found"));
}

// The rows a statement RETURNING kCheckpointColumns gave, appended to *rows.
absl::Status AppendCheckpointRows(const db::Result& result, std::vector<CheckpointRow>* rows) {
  for (const db::Row& r : result) {
    GRADHUB_ASSIGN_OR_RETURN(CheckpointRow row, CheckpointFromRow(r));
    rows->push_back(std::move(row));
  }
  return absl::OkStatus();
}

// The job's CHECKPOINT_COMMITTED event.
absl::Status AppendCommittedEvent(db::Transaction& tx, const CheckpointRow& row,
                                  const std::string& sha256) {
  api::EventDetails committed =
      api::Because(absl::StrCat("checkpoint at step ", row.step, " committed: ", row.size_bytes,
                                " bytes, sha256 ", sha256.substr(0, 12)));
  committed.checkpoint_step = row.step;
  committed.checkpoint_size_bytes = row.size_bytes;
  return api::AppendEvent(tx, row.job_id, row.attempt, v1::JobEvent::CHECKPOINT_COMMITTED,
                          std::nullopt, std::nullopt, committed);
}

// Retention: the keep_last committed checkpoints with the highest steps stay; the others are
// marked DELETED and appended to *retired, for their blobs to go after the transaction.
absl::Status RetireBeyondKeepLast(db::Transaction& tx, const std::string& job_id, int32_t keep_last,
                                  std::vector<CheckpointRow>* retired) {
  GRADHUB_ASSIGN_OR_RETURN(
      db::Result old,
      tx.Exec(absl::StrCat("UPDATE checkpoints c SET state = 'DELETED'"
                           " WHERE c.job_id = $1::uuid AND c.state = 'COMMITTED'"
                           " AND c.id NOT IN (SELECT id FROM checkpoints WHERE job_id = $1::uuid"
                           "   AND state = 'COMMITTED' ORDER BY step DESC, id DESC LIMIT $2)"
                           " RETURNING ",
                           kCheckpointColumns),
              {job_id, keep_last}));
  return AppendCheckpointRows(old, retired);
}

// Uploads a commit of `row` supersedes (checkpoint.proto, StartUpload): an earlier step, or an
// earlier attempt. Their rows go now, appended to *abandoned; their upload files after the
// transaction.
absl::Status DeleteSupersededUploads(db::Transaction& tx, const CheckpointRow& row,
                                     std::vector<CheckpointRow>* abandoned) {
  GRADHUB_ASSIGN_OR_RETURN(
      db::Result superseded,
      tx.Exec(absl::StrCat("DELETE FROM checkpoints c WHERE c.job_id = $1::uuid"
                           " AND c.state = 'UPLOADING' AND (c.attempt < $2 OR c.step < $3)"
                           " RETURNING ",
                           kCheckpointColumns),
              {row.job_id, row.attempt, row.step}));
  return AppendCheckpointRows(superseded, abandoned);
}

}  // namespace

std::string CleanupReport::ToString() const {
  return absl::StrCat("orphan upload files removed: ", orphan_uploads,
                      "; stale uploads discarded: ", stale_uploads,
                      "; blobs without a committed row removed: ", orphan_blobs,
                      "; committed checkpoints with a missing blob marked BAD: ", missing_blobs,
                      "; checkpoints marked for deletion removed: ", deleted_rows);
}

std::string ScrubReport::ToString() const {
  return absl::StrCat("checkpoints checked: ", checked, " (", bytes, " bytes); marked BAD: ", bad);
}

CheckpointManager::CheckpointManager(db::Pool* pool, BlobStore* blobs, CheckpointMetrics* metrics,
                                     CheckpointManagerOptions options)
    : pool_(pool),
      blobs_(blobs),
      metrics_(metrics),
      options_(std::move(options)),
      transfers_(options_.max_transfers, options_.max_transfers_per_caller, [metrics](int n) {
        if (metrics != nullptr) metrics->SetTransfersInProgress(n);
      }) {}

CheckpointManager::~CheckpointManager() = default;

void CheckpointManager::Failure(std::string_view reason) {
  if (metrics_ != nullptr) metrics_->RecordFailure(reason);
}

absl::StatusOr<TransferSlots::Slot> CheckpointManager::AcquireTransfer(const Caller& caller) {
  absl::StatusOr<TransferSlots::Slot> slot = transfers_.Acquire(CallerKey(caller));
  if (!slot.ok()) Failure("too_many_transfers");
  return slot;
}

void CheckpointManager::FoundBad(std::string_view found_by) {
  if (metrics_ != nullptr) metrics_->RecordBad(found_by);
}

std::shared_ptr<CheckpointManager::UploadState> CheckpointManager::State(
    const std::string& upload_id) {
  absl::MutexLock lock(&states_mu_);
  std::shared_ptr<UploadState>& state = states_[upload_id];
  if (state == nullptr) state = std::make_shared<UploadState>();
  return state;
}

void CheckpointManager::ForgetState(const std::string& upload_id) {
  absl::MutexLock lock(&states_mu_);
  states_.erase(upload_id);
}

absl::StatusOr<CheckpointRow> CheckpointManager::ReadUpload(const std::string& upload_id) {
  if (!IsUuid(upload_id)) return UploadNotFound(upload_id);
  GRADHUB_ASSIGN_OR_RETURN(
      db::Result rows, pool_->Exec(absl::StrCat("SELECT ", kCheckpointColumns,
                                                " FROM checkpoints c WHERE c.upload_id = $1::uuid"
                                                " AND c.state <> 'DELETED'"),
                                   {upload_id}));
  if (rows.empty()) return UploadNotFound(upload_id);
  return CheckpointFromRow(rows.row(0));
}

absl::StatusOr<v1::StartUploadResponse> CheckpointManager::StartUpload(
    const Caller& caller, const v1::StartUploadRequest& request) {
  GRADHUB_RETURN_IF_ERROR(CheckKind(caller, Access::kUpload));
  GRADHUB_RETURN_IF_ERROR(ValidateStart(request));
  const std::string job_id = api::JobId(request.job());
  GRADHUB_ASSIGN_OR_RETURN(
      const CheckpointRow row,
      pool_->Transact([&](db::Transaction& tx) -> absl::StatusOr<CheckpointRow> {
        // FOR SHARE: the job cannot move to another attempt until this upload is recorded.
        GRADHUB_RETURN_IF_ERROR(
            AuthorizeJob(tx, caller, job_id, Access::kUpload, request.attempt(), JobLock::kShare)
                .status());
        return InsertUpload(tx, job_id, request);
      }));
  v1::StartUploadResponse response;
  response.set_upload_id(row.upload_id);
  response.set_chunk_size_bytes(options_.chunk_size_bytes);
  return response;
}

absl::StatusOr<std::unique_ptr<UploadWriter>> CheckpointManager::OpenUpload(
    const Caller& caller, const std::string& upload_id) {
  GRADHUB_RETURN_IF_ERROR(CheckKind(caller, Access::kUpload));
  GRADHUB_ASSIGN_OR_RETURN(CheckpointRow row, ReadUpload(upload_id));
  if (row.state != "UPLOADING" && row.state != "COMMITTED") {
    return absl::FailedPreconditionError(absl::StrCat("upload '", upload_id, "' is ", row.state));
  }
  GRADHUB_RETURN_IF_ERROR(pool_->Transact(
      [&](db::Transaction& tx) {
        return AuthorizeJob(tx, caller, row.job_id,
                            row.state == "UPLOADING" ? Access::kUpload : Access::kRead, row.attempt)
            .status();
      },
      {.read_only = true}));
  GRADHUB_ASSIGN_OR_RETURN(TransferSlots::Slot slot, AcquireTransfer(caller));
  // A committed upload only answers probes: it needs no state of its own in the map.
  std::shared_ptr<UploadState> state =
      row.state == "UPLOADING" ? State(upload_id) : std::make_shared<UploadState>();
  return std::unique_ptr<UploadWriter>(
      new UploadWriter(this, std::move(row), std::move(state), std::move(slot)));
}

absl::Status UploadWriter::Write(int64_t offset, std::string data, std::optional<uint32_t> crc32c) {
  {
    absl::MutexLock lock(&result_mu_);
    if (!result_.ok()) return result_.status();
  }
  if (data.empty()) {  // a probe: answered after what came before
    Flush();
    Queue(0, [this, offset] { return WriteNow(offset, "", Crc32c("")); });
    return absl::OkStatus();
  }
  const bool continues =
      filling_ != nullptr &&
      offset == filling_->offset + static_cast<int64_t>(filling_->bytes.size()) &&
      filling_->bytes.size() + data.size() <= kBatchBytes;
  if (!continues) Flush();
  if (filling_ == nullptr) {
    absl::MutexLock lock(&spare_mu_);
    if (spare_.empty()) {
      filling_ = std::make_shared<Batch>();
    } else {
      filling_ = std::move(spare_.back());
      spare_.pop_back();
    }
    filling_->offset = offset;
    filling_->bytes.Truncate(0);
    filling_->checked = true;
    filling_->crc32c = 0;
  }
  const size_t at = filling_->bytes.Append(data);
  if (!crc32c.has_value()) {
    filling_->checked = false;
  } else {
    const uint32_t received = Crc32c(filling_->bytes.view().substr(at));
    if (received != *crc32c) {
      filling_->bytes.Truncate(at);
      Flush();
      const int64_t end = offset + static_cast<int64_t>(data.size());
      Queue(0, [this, offset, end, sent = *crc32c, received]() -> absl::StatusOr<int64_t> {
        return CrcMismatch(offset, end, sent, received);
      });
      return absl::OkStatus();
    }
    filling_->crc32c = Crc32cCombine(filling_->crc32c, received, data.size());
  }
  if (filling_->bytes.size() >= kBatchBytes) Flush();
  return absl::OkStatus();
}

void UploadWriter::Flush() {
  std::shared_ptr<Batch> batch = std::move(filling_);
  filling_ = nullptr;
  if (batch == nullptr || batch->bytes.size() == 0) return;
  const size_t bytes = batch->bytes.size();
  Queue(bytes, [this, batch = std::move(batch)] {
    absl::StatusOr<int64_t> written =
        WriteNow(batch->offset, batch->bytes.view(),
                 batch->checked ? std::optional<uint32_t>(batch->crc32c) : std::nullopt);
    absl::MutexLock lock(&spare_mu_);
    spare_.push_back(batch);
    return written;
  });
}

void UploadWriter::Queue(size_t bytes, std::function<absl::StatusOr<int64_t>()> task) {
  worker_.Submit(bytes, [this, task = std::move(task)] {
    {
      absl::MutexLock lock(&result_mu_);
      if (!result_.ok()) return;  // after an error, nothing more is written
    }
    absl::StatusOr<int64_t> outcome = task();
    absl::MutexLock lock(&result_mu_);
    result_ = std::move(outcome);
  });
}

absl::StatusOr<int64_t> UploadWriter::Finish() {
  Flush();
  worker_.Drain();
  absl::MutexLock lock(&result_mu_);
  return result_;
}

absl::Status UploadWriter::CrcMismatch(int64_t offset, int64_t end, uint32_t sent,
                                       uint32_t received) {
  manager_->Failure("crc32c_mismatch");
  absl::MutexLock lock(&state_->mu);
  return absl::DataLossError(absl::StrFormat(
      "crc32c: bytes %d..%d arrived with crc32c %08x, the chunk says %08x; nothing of it was "
      "written, send it again from offset %d",
      offset, end, received, sent, state_->held));
}

absl::StatusOr<int64_t> UploadWriter::WriteNow(int64_t offset, std::string_view data,
                                               std::optional<uint32_t> crc32c) {
  UploadState& state = *state_;
  absl::MutexLock lock(&state.mu);
  if (state.discarded) return UploadNotFound(row_.upload_id);
  if (state.committed || row_.state == "COMMITTED") {
    if (data.empty()) return row_.size_bytes;
    return absl::FailedPreconditionError(
        absl::StrCat("upload '", row_.upload_id, "' is already committed"));
  }
  BlobStore& blobs = *manager_->blobs_;
  if (!state.loaded) {
    GRADHUB_ASSIGN_OR_RETURN(const int64_t held, blobs.UploadedBytes(row_.upload_id));
    state.Reload(held);
  }
  if (data.empty()) return state.held;
  const int64_t end = offset + static_cast<int64_t>(data.size());
  if (offset < 0 || end > row_.size_bytes) {
    manager_->Failure("out_of_range");
    return absl::OutOfRangeError(absl::StrCat("bytes ", offset, "..", end, " are outside the ",
                                              row_.size_bytes, " bytes declared at StartUpload"));
  }
  if (offset > state.held) {
    manager_->Failure("gap");
    return absl::OutOfRangeError(absl::StrCat("offset ", offset, " is beyond the ", state.held,
                                              " bytes received; resume at ", state.held));
  }
  absl::StatusOr<int64_t> held = blobs.Append(row_.upload_id, offset, data);
  if (!held.ok()) {
    state.loaded = false;  // a failed write may have stored part of the chunk
    manager_->Failure("write_error");
    return held.status();
  }
  if (*held > state.held) {
    // Part of the batch may have been held already (sent again after a break).
    const size_t from = static_cast<size_t>(state.held - offset);
    const size_t stored = static_cast<size_t>(*held - state.held);
    if (state.digested) {
      state.crc32c = crc32c.has_value() && from == 0 && stored == data.size()
                         ? Crc32cCombine(state.crc32c, *crc32c, stored)
                         : Crc32cExtend(state.crc32c, data.substr(from, stored));
      state.sha256.Update(data.substr(from, stored));
    }
    if (manager_->metrics_ != nullptr) manager_->metrics_->RecordReceived(*held - state.held);
    state.held = *held;
    state.last_write = absl::Now();
  }
  return state.held;
}

absl::Status CheckpointManager::Discard(const CheckpointRow& row, UploadState& state) {
  state.discarded = true;
  ForgetState(row.upload_id);
  // The row first: once it is gone nothing refers to the bytes, and bytes left behind by a
  // failure below are orphans that Cleanup removes.
  GRADHUB_RETURN_IF_ERROR(
      pool_->Exec("DELETE FROM checkpoints WHERE id = $1 AND state = 'UPLOADING'", {row.id})
          .status());
  GRADHUB_RETURN_IF_ERROR(blobs_->Abort(row.upload_id));
  return blobs_->Delete(row.blob_key);
}

absl::StatusOr<v1::Checkpoint> CheckpointManager::Commit(
    const Caller& caller, const v1::CommitCheckpointRequest& request) {
  const absl::Time start = absl::Now();
  GRADHUB_RETURN_IF_ERROR(CheckKind(caller, Access::kUpload));
  if (!request.sha256().empty() && !IsSha256Hex(request.sha256())) {
    return absl::InvalidArgumentError(
        "sha256: must be 64 lowercase hex characters, or empty for the store's own");
  }
  GRADHUB_ASSIGN_OR_RETURN(CheckpointRow row, ReadUpload(request.upload_id()));
  // Only an upload in progress has (and needs) in-memory state and its lock.
  std::shared_ptr<UploadState> state;
  std::optional<absl::MutexLock> lock;
  if (row.state == "UPLOADING") {
    state = State(row.upload_id);
    lock.emplace(&state->mu);
    if (state->discarded) return UploadNotFound(row.upload_id);
    // Read again under the upload's lock: a concurrent commit of it may have finished meanwhile.
    GRADHUB_ASSIGN_OR_RETURN(row, ReadUpload(row.upload_id));
    if (row.state != "UPLOADING") ForgetState(row.upload_id);
  }
  if (row.state == "COMMITTED") {
    GRADHUB_RETURN_IF_ERROR(pool_->Transact(
        [&](db::Transaction& tx) {
          return AuthorizeJob(tx, caller, row.job_id, Access::kRead, 0).status();
        },
        {.read_only = true}));
    if (!request.sha256().empty() && row.sha256 != request.sha256()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "upload '", row.upload_id, "' is already committed with sha256 ", row.sha256));
    }
    return row.proto;  // idempotent
  }
  if (row.state != "UPLOADING") {
    return absl::FailedPreconditionError(
        absl::StrCat("upload '", row.upload_id, "' is ", row.state));
  }
  GRADHUB_RETURN_IF_ERROR(pool_->Transact(
      [&](db::Transaction& tx) {
        return AuthorizeJob(tx, caller, row.job_id, Access::kUpload, row.attempt).status();
      },
      {.read_only = true}));
  const std::optional<uint32_t> client_crc32c =
      request.has_crc32c() ? std::optional<uint32_t>(request.crc32c()) : std::nullopt;
  absl::StatusOr<v1::Checkpoint> committed =
      CommitLocked(row, request.sha256(), client_crc32c, *state);
  if (committed.ok() && metrics_ != nullptr) metrics_->RecordCommit(absl::Now() - start);
  return committed;
}

// Step 3 under the upload's lock, once the caller may commit it.
absl::StatusOr<v1::Checkpoint> CheckpointManager::CommitLocked(
    const CheckpointRow& row, const std::string& client_sha256,
    std::optional<uint32_t> client_crc32c, UploadState& state) {
  // 1-2. The bytes, whole, durable and visible under the blob key.
  GRADHUB_ASSIGN_OR_RETURN(const bool digested, PlaceBlob(row, state));
  // 3. The digests to record: this process's own of the bytes it received, or those of the
  //    blob read back; the client's must match them.
  GRADHUB_ASSIGN_OR_RETURN(const RecordedDigests digests,
                           VerifiedDigests(row, client_sha256, client_crc32c, state, digested));
  // 4. The row, its event and retention in one transaction; then the retired blobs.
  std::vector<CheckpointRow> retired, abandoned;
  absl::StatusOr<v1::Checkpoint> committed = WriteCommittedRow(row, digests, &retired, &abandoned);
  if (absl::IsFailedPrecondition(committed.status()) || absl::IsAlreadyExists(committed.status())) {
    // The attempt ended or the step was committed by another upload: this one never will be.
    Failure(absl::IsAlreadyExists(committed.status()) ? "step_exists" : "not_current_attempt");
    GRADHUB_RETURN_IF_ERROR(Discard(row, state));
  }
  if (!committed.ok()) return committed.status();
  state.committed = true;
  ForgetState(row.upload_id);
  RemoveAfterCommit(std::move(retired), abandoned);
  return committed;
}

// Commit steps 1-2: all bytes received (an earlier commit that failed after step 2 left the
// bytes as the blob already, with no upload: then it goes on from the blob), then committed
// to the blob key. True when this process checked every byte's crc32c on the way in.
absl::StatusOr<bool> CheckpointManager::PlaceBlob(const CheckpointRow& row, UploadState& state) {
  GRADHUB_ASSIGN_OR_RETURN(const int64_t held, blobs_->UploadedBytes(row.upload_id));
  state.Reload(held);
  bool in_store = false;
  if (state.held < row.size_bytes || row.size_bytes == 0) {
    absl::StatusOr<int64_t> blob_size = blobs_->BlobSize(row.blob_key);
    in_store = blob_size.ok();
    if (!in_store && state.held < row.size_bytes) {
      Failure("incomplete");
      return absl::FailedPreconditionError(
          absl::StrCat("received ", state.held, " of the ", row.size_bytes,
                       " bytes declared; keep uploading from offset ", state.held));
    }
  }
  if (in_store) return false;
  if (row.size_bytes == 0) GRADHUB_RETURN_IF_ERROR(blobs_->Append(row.upload_id, 0, "").status());
  GRADHUB_RETURN_IF_ERROR(blobs_->Commit(row.upload_id, row.blob_key));
  return state.digested && state.held == row.size_bytes;
}

// Commit step 3: the digests a commit records.
//   1. Bytes this process wrote, all of them and in order, have its own crc32c and sha256:
//      both of the bytes received, so the crc32c covers the sha256. A crc32c the client sent,
//      of the memory it sent from, must be the same, and so must a sha256 it sent.
//   2. Otherwise (a restart during the upload) the committed blob is read back and hashed, and
//      the client's sha256, if any, must match it.
// No row says COMMITTED yet, so a mismatch is still an upload to discard.
absl::StatusOr<CheckpointManager::RecordedDigests> CheckpointManager::VerifiedDigests(
    const CheckpointRow& row, const std::string& client_sha256,
    std::optional<uint32_t> client_crc32c, UploadState& state, bool digested) {
  if (digested) {
    if (client_crc32c.has_value() && *client_crc32c != state.crc32c) {
      Failure("crc32c_mismatch");
      GRADHUB_RETURN_IF_ERROR(Discard(row, state));
      return absl::DataLossError(absl::StrFormat(
          "crc32c: the bytes received have crc32c %08x, the commit says %08x (the bytes sent "
          "changed after the client took their crc32c); the upload is discarded, start a new "
          "one",
          state.crc32c, *client_crc32c));
    }
    const std::string own_sha256 = state.sha256.Hex();
    if (!client_sha256.empty() && own_sha256 != client_sha256) {
      return Sha256Mismatch(row, state, absl::StrCat("sha256 ", client_sha256),
                            absl::StrCat("their sha256 is ", own_sha256));
    }
    return RecordedDigests{own_sha256, state.crc32c, true};
  }
  const absl::StatusOr<HashedBlob> blob = HashBlob(row.blob_key);
  // DATA_LOSS: the blob does not read back whole (a store that encrypts found it changed).
  if (!blob.ok() && !absl::IsDataLoss(blob.status())) return blob.status();
  if (!blob.ok() || blob->size != row.size_bytes ||
      (!client_sha256.empty() && blob->digests.sha256 != client_sha256)) {
    return Sha256Mismatch(row, state,
                          client_sha256.empty()
                              ? absl::StrCat("the ", row.size_bytes, " bytes declared")
                              : absl::StrCat("sha256 ", client_sha256),
                          blob.ok() ? absl::StrCat(blob->size, " bytes read back")
                                    : std::string(blob.status().message()));
  }
  return RecordedDigests{blob->digests.sha256, blob->digests.crc32c, true};
}

absl::Status CheckpointManager::Sha256Mismatch(const CheckpointRow& row, UploadState& state,
                                               const std::string& claim,
                                               const std::string& received) {
  Failure("sha256_mismatch");
  GRADHUB_RETURN_IF_ERROR(Discard(row, state));
  return absl::DataLossError(absl::StrCat(claim, " does not match the bytes received (", received,
                                          "); the upload is discarded, start a new one"));
}

// After a commit's transaction: the checkpoints retention retired go on the removal worker;
// the uploads it superseded lose their files now.
void CheckpointManager::RemoveAfterCommit(std::vector<CheckpointRow> retired,
                                          const std::vector<CheckpointRow>& abandoned) {
  if (!retired.empty()) {
    removals_.Submit(1, [this, retired = std::move(retired)] { RemoveDeleted(retired); });
  }
  for (const CheckpointRow& upload : abandoned) {
    // Without its row, a writer still holding the upload's state gets NOT_FOUND at commit; an
    // upload file it recreates is an orphan for Cleanup.
    ForgetState(upload.upload_id);
    blobs_->Abort(upload.upload_id).IgnoreError();
    blobs_->Delete(upload.blob_key).IgnoreError();  // a crash between its blob and its row
    Failure("superseded");
  }
}

absl::StatusOr<CheckpointManager::HashedBlob> CheckpointManager::HashBlob(
    const std::string& blob_key) {
  GRADHUB_ASSIGN_OR_RETURN(std::unique_ptr<BlobReader> reader, blobs_->Open(blob_key, 0));
  HashedBlob blob;
  blob.size = reader->size();
  HashingReadAhead ahead(std::move(reader), blob.size,
                         static_cast<size_t>(options_.chunk_size_bytes));
  std::string chunk;
  do {
    GRADHUB_RETURN_IF_ERROR(ahead.Next(&chunk));
  } while (!chunk.empty());
  const std::optional<BlobDigests> digests = ahead.Digests();
  if (!digests.has_value()) return absl::InternalError("the blob's read-ahead stopped early");
  blob.digests = *digests;
  return blob;
}

absl::StatusOr<v1::Checkpoint> CheckpointManager::WriteCommittedRow(
    const CheckpointRow& row, const RecordedDigests& digests, std::vector<CheckpointRow>* retired,
    std::vector<CheckpointRow>* abandoned) {
  return pool_->Transact([&](db::Transaction& tx) -> absl::StatusOr<v1::Checkpoint> {
    retired->clear();
    abandoned->clear();
    // The job's row locked: commits of one job (and its retention) run one at a time, and the
    // job cannot move to another attempt until this one's checkpoint is in.
    GRADHUB_ASSIGN_OR_RETURN(const JobRow job, ReadJobRow(tx, row.job_id, JobLock::kNoKeyUpdate));
    GRADHUB_RETURN_IF_ERROR(CheckAttemptMaySave(job, row.attempt));
    GRADHUB_ASSIGN_OR_RETURN(
        db::Result taken, tx.Exec("SELECT 1 FROM checkpoints WHERE job_id = $1::uuid AND step = $2"
                                  " AND state = 'COMMITTED'",
                                  {row.job_id, row.step}));
    if (!taken.empty()) {
      return absl::AlreadyExistsError(absl::StrCat(
          "jobs/", row.job_id, " already has a committed checkpoint at step ", row.step));
    }
    GRADHUB_ASSIGN_OR_RETURN(
        db::Result updated,
        tx.Exec(absl::StrCat("UPDATE checkpoints c SET state = 'COMMITTED',"
                             " sha256 = decode($2, 'hex'), crc32c = $3,"
                             " crc32c_covers_sha256 = $4, commit_time = now()"
                             " WHERE c.id = $1 AND c.state = 'UPLOADING' RETURNING ",
                             kCheckpointColumns),
                {row.id, digests.sha256, static_cast<int64_t>(digests.crc32c),
                 digests.crc32c_covers_sha256}));
    if (updated.empty()) return UploadNotFound(row.upload_id);  // discarded meanwhile
    GRADHUB_ASSIGN_OR_RETURN(const CheckpointRow done, CheckpointFromRow(updated.row(0)));
    GRADHUB_RETURN_IF_ERROR(AppendCommittedEvent(tx, row, digests.sha256));
    GRADHUB_RETURN_IF_ERROR(RetireBeyondKeepLast(tx, row.job_id, job.keep_last, retired));
    GRADHUB_RETURN_IF_ERROR(DeleteSupersededUploads(tx, row, abandoned));
    return done.proto;
  });
}

int CheckpointManager::RemoveDeleted(const std::vector<CheckpointRow>& rows) {
  int removed = 0;
  for (const CheckpointRow& row : rows) {
    // Blob first: a row marked DELETED is how Cleanup finds a blob left behind.
    if (!blobs_->Delete(row.blob_key).ok()) continue;
    if (pool_->Exec("DELETE FROM checkpoints WHERE id = $1 AND state = 'DELETED'", {row.id}).ok()) {
      ++removed;
    }
  }
  return removed;
}

absl::StatusOr<std::unique_ptr<CheckpointDownload>> CheckpointManager::OpenDownload(
    const Caller& caller, const std::string& name, int64_t offset, bool verify_sha256) {
  GRADHUB_RETURN_IF_ERROR(CheckKind(caller, Access::kRead));
  GRADHUB_ASSIGN_OR_RETURN(const ParsedName parsed, ParseCheckpointName(name));
  if (offset < 0) return absl::InvalidArgumentError("offset: must not be negative");
  GRADHUB_ASSIGN_OR_RETURN(
      CheckpointRow row,
      pool_->Transact(
          [&](db::Transaction& tx) -> absl::StatusOr<CheckpointRow> {
            GRADHUB_RETURN_IF_ERROR(
                AuthorizeJob(tx, caller, parsed.job_id, Access::kRead, 0).status());
            // The committed one of the step, else the newest BAD one (to say why).
            GRADHUB_ASSIGN_OR_RETURN(
                db::Result rows,
                tx.Exec(absl::StrCat("SELECT ", kCheckpointColumns, " FROM checkpoints c",
                                     " WHERE c.job_id = $1::uuid AND c.step = $2",
                                     " AND c.state IN ('COMMITTED', 'BAD')",
                                     " ORDER BY c.state = 'COMMITTED' DESC, c.id DESC LIMIT 1"),
                        {parsed.job_id, parsed.step}));
            if (rows.empty())
              return absl::NotFoundError(absl::StrCat("checkpoint '", name, "' not found"));
            return CheckpointFromRow(rows.row(0));
          },
          {.read_only = true}));
  if (row.state == "BAD") {
    return absl::DataLossError(absl::StrCat("checkpoint '", name, "' is BAD (", row.bad_reason,
                                            "); ask GetLatestCheckpoint for another"));
  }
  if (offset > row.size_bytes) {
    return absl::OutOfRangeError(
        absl::StrCat("offset ", offset, " is beyond the checkpoint's ", row.size_bytes, " bytes"));
  }
  GRADHUB_ASSIGN_OR_RETURN(TransferSlots::Slot slot, AcquireTransfer(caller));
  absl::StatusOr<std::unique_ptr<BlobReader>> reader = blobs_->Open(row.blob_key, 0);
  const bool lost = absl::IsNotFound(reader.status()) || absl::IsDataLoss(reader.status());
  if (!reader.ok() && !lost) return reader.status();
  auto download = std::unique_ptr<CheckpointDownload>(
      new CheckpointDownload(this, std::move(row), std::move(slot)));
  // DATA_LOSS: a store that encrypts found a file that is not the blob (sealed_blob_store.h).
  if (absl::IsDataLoss(reader.status())) return download->Corrupt(reader.status().ToString());
  if (!reader.ok()) return download->Corrupt("its blob is missing");
  if ((*reader)->size() != download->row_.size_bytes) {
    return download->Corrupt(absl::StrCat("its blob has ", (*reader)->size(), " bytes instead of ",
                                          download->row_.size_bytes));
  }
  // The crc32c recorded at the commit is checked, and the sha256 only when asked (or when
  // there is no crc32c): the client checks the sha256 end to end, and a SHA-256 costs the store
  // ten times the CPU.
  download->check_sha256_ = verify_sha256 || !download->row_.crc32c.has_value();
  download->ahead_ = std::make_unique<HashingReadAhead>(
      *std::move(reader), download->row_.size_bytes, static_cast<size_t>(options_.chunk_size_bytes),
      ReadAheadOptions{.sha256 = download->check_sha256_});
  GRADHUB_RETURN_IF_ERROR(download->Skip(offset));
  return download;
}

absl::Status CheckpointDownload::Take(std::string* data) {
  const absl::Status read = ahead_->Next(data);
  if (absl::IsDataLoss(read)) return Corrupt(std::string(read.message()));
  if (read.ok() && data->empty()) return Corrupt("its blob ended early");
  return read;
}

absl::Status CheckpointDownload::Skip(int64_t offset) {
  std::string chunk;
  while (position_ < offset) {
    GRADHUB_RETURN_IF_ERROR(Take(&chunk));
    const int64_t end = position_ + static_cast<int64_t>(chunk.size());
    if (end > offset) skipped_tail_ = chunk.substr(static_cast<size_t>(offset - position_));
    position_ = std::min(end, offset);
  }
  return absl::OkStatus();
}

absl::Status CheckpointDownload::Next(std::string* data) {
  data->clear();
  const int64_t size = row_.size_bytes;
  if (position_ < size) {
    if (!skipped_tail_.empty()) {
      *data = std::move(skipped_tail_);
      skipped_tail_.clear();
    } else {
      GRADHUB_RETURN_IF_ERROR(Take(data));
    }
    position_ += static_cast<int64_t>(data->size());
    if (position_ < size) return absl::OkStatus();
  } else if (verified_) {
    return absl::OkStatus();  // the end, already checked
  }
  // The whole blob was read: the last chunk goes out only if it matched.
  verified_ = true;
  const std::optional<BlobDigests> digests = ahead_->Digests();
  if (!digests.has_value() || (row_.crc32c.has_value() && digests->crc32c != *row_.crc32c)) {
    data->clear();
    return Corrupt("its blob no longer matches its crc32c");
  }
  if (check_sha256_ && digests->sha256 != row_.sha256) {
    data->clear();
    return Corrupt("its blob does not match its sha256");
  }
  return absl::OkStatus();
}

absl::Status CheckpointDownload::Corrupt(const std::string& reason) {
  manager_->Failure("corrupt_blob");
  absl::StatusOr<bool> marked = MarkBad(*manager_->pool_, row_.id, reason);
  if (marked.ok() && *marked) manager_->FoundBad("download");
  return absl::DataLossError(absl::StrCat("checkpoint '", row_.proto.name(), "': ", reason,
                                          "; it is marked BAD: ask GetLatestCheckpoint for "
                                          "the previous one"));
}

absl::StatusOr<v1::ListCheckpointsResponse> CheckpointManager::List(
    const Caller& caller, const v1::ListCheckpointsRequest& request) {
  GRADHUB_RETURN_IF_ERROR(CheckKind(caller, Access::kManage));
  GRADHUB_ASSIGN_OR_RETURN(const int32_t page_size, api::ListPageSize(request.page_size()));
  const std::string job_id = api::JobId(request.parent());
  std::string sql = absl::StrCat("SELECT ", kCheckpointColumns, " FROM checkpoints c",
                                 " WHERE c.job_id = $1::uuid AND c.state <> 'DELETED'");
  db::ParamList params = {job_id};
  GRADHUB_ASSIGN_OR_RETURN(std::vector<api::FilterTerm> terms,
                           api::ParseListFilter(request.filter()));
  for (const api::FilterTerm& term : terms) {
    v1::Checkpoint::State state = v1::Checkpoint::STATE_UNSPECIFIED;
    if (term.field != "state") {
      return absl::InvalidArgumentError(
          absl::StrCat("filter: unknown field '", term.field, "' (state)"));
    }
    if (!v1::Checkpoint::State_Parse(term.value, &state) ||
        state == v1::Checkpoint::STATE_UNSPECIFIED) {
      return absl::InvalidArgumentError(
          absl::StrCat("filter: state '", term.value, "' is not a checkpoint state"));
    }
    absl::StrAppend(&sql, " AND c.state = ", params.Bind(term.value));
  }
  if (!request.page_token().empty()) {
    // The step and id of the last checkpoint of the previous page (page_token.h).
    constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
    GRADHUB_ASSIGN_OR_RETURN(const std::vector<std::string> key,
                             ReadPageToken(request.page_token(), "checkpoints", 2));
    GRADHUB_ASSIGN_OR_RETURN(const int64_t step, PageTokenInt(key[0], 0, kMax));
    GRADHUB_ASSIGN_OR_RETURN(const int64_t id, PageTokenInt(key[1], 0, kMax));
    absl::StrAppend(&sql, " AND (c.step, c.id) < (", params.Bind(step), "::bigint, ",
                    params.Bind(id), "::bigint)");
  }
  absl::StrAppend(&sql, " ORDER BY c.step DESC, c.id DESC LIMIT ", params.Bind(page_size + 1));
  return pool_->Transact(
      [&](db::Transaction& tx) -> absl::StatusOr<v1::ListCheckpointsResponse> {
        GRADHUB_RETURN_IF_ERROR(AuthorizeJob(tx, caller, job_id, Access::kManage, 0).status());
        GRADHUB_ASSIGN_OR_RETURN(db::Result rows, tx.Exec(sql, params.values()));
        v1::ListCheckpointsResponse response;
        for (int i = 0; i < rows.rows() && i < page_size; ++i) {
          GRADHUB_ASSIGN_OR_RETURN(CheckpointRow row, CheckpointFromRow(rows.row(i)));
          *response.add_checkpoints() = std::move(row.proto);
          if (i == page_size - 1 && rows.rows() > page_size) {
            response.set_next_page_token(
                MakePageToken("checkpoints", {absl::StrCat(row.step), absl::StrCat(row.id)}));
          }
        }
        return response;
      },
      {.read_only = true});
}

absl::StatusOr<v1::Checkpoint> CheckpointManager::GetLatest(const Caller& caller,
                                                            const std::string& job) {
  GRADHUB_RETURN_IF_ERROR(CheckKind(caller, Access::kRead));
  const std::string job_id = api::JobId(job);
  return pool_->Transact(
      [&](db::Transaction& tx) -> absl::StatusOr<v1::Checkpoint> {
        GRADHUB_RETURN_IF_ERROR(AuthorizeJob(tx, caller, job_id, Access::kRead, 0).status());
        GRADHUB_ASSIGN_OR_RETURN(
            db::Result rows,
            tx.Exec(absl::StrCat("SELECT ", kCheckpointColumns, " FROM checkpoints c",
                                 " WHERE c.job_id = $1::uuid AND c.state = 'COMMITTED'"
                                 " ORDER BY c.step DESC LIMIT 1"),
                    {job_id}));
        if (rows.empty()) {
          return absl::NotFoundError(absl::StrCat(job, " has no committed checkpoint"));
        }
        GRADHUB_ASSIGN_OR_RETURN(CheckpointRow row, CheckpointFromRow(rows.row(0)));
        return row.proto;
      },
      {.read_only = true});
}

absl::Status CheckpointManager::Delete(const Caller& caller, const std::string& name) {
  GRADHUB_RETURN_IF_ERROR(CheckKind(caller, Access::kManage));
  GRADHUB_ASSIGN_OR_RETURN(const ParsedName parsed, ParseCheckpointName(name));
  GRADHUB_ASSIGN_OR_RETURN(
      const std::vector<CheckpointRow> rows,
      pool_->Transact([&](db::Transaction& tx) -> absl::StatusOr<std::vector<CheckpointRow>> {
        GRADHUB_RETURN_IF_ERROR(
            AuthorizeJob(tx, caller, parsed.job_id, Access::kManage, 0).status());
        GRADHUB_ASSIGN_OR_RETURN(
            db::Result marked,
            tx.Exec(absl::StrCat("UPDATE checkpoints c SET state = 'DELETED'"
                                 " WHERE c.job_id = $1::uuid AND c.step = $2"
                                 " AND c.state IN ('COMMITTED', 'BAD') RETURNING ",
                                 kCheckpointColumns),
                    {parsed.job_id, parsed.step}));
        if (marked.empty()) {
          return absl::NotFoundError(absl::StrCat("checkpoint '", name, "' not found"));
        }
        std::vector<CheckpointRow> out;
        for (const db::Row& r : marked) {
          GRADHUB_ASSIGN_OR_RETURN(CheckpointRow row, CheckpointFromRow(r));
          out.push_back(std::move(row));
        }
        return out;
      }));
  // Marked in the transaction above: what is not removed now, Cleanup removes later.
  RemoveDeleted(rows);
  return absl::OkStatus();
}

absl::Status CheckpointManager::CheckReady() {
  absl::StatusOr<db::Pool::Lease> lease = pool_->Acquire();
  if (!lease.ok()) return absl::UnavailableError(lease.status().message());
  absl::Status migrated = db::Migrator().CheckUpToDate(**lease);
  if (!migrated.ok()) return absl::UnavailableError(migrated.message());
  return absl::OkStatus();
}

}  // namespace gradhub::checkpoint
