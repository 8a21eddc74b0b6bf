// The checkpoint store's domain logic: the upload protocol, downloads that verify what they
// send, retention, and the cleanup and scrub that keep rows and blobs in agreement. Rows live in
// PostgreSQL (table checkpoints), bytes in a BlobStore. The gRPC and REST adapters only
// authenticate, make one call here, and map the status.
//
// Saving one checkpoint (checkpoint.proto, steps 1-3):
//   1. StartUpload: the caller's right to upload for that attempt (checkpoint_access.h), then
//      one UPLOADING row with a fresh upload_id (or the row of an earlier call with the same
//      request_id).
//   2. OpenUpload + UploadWriter::Write per chunk: each chunk's crc32c is checked, then its
//      bytes go to the BlobStore's upload without gaps (on a thread of the stream's own while
//      the stream receives the next chunk).
//   3. Commit: size check; BlobStore::Commit makes the blob durable and visible. The writes
//      of step 2 also digested the bytes in order (CRC-32C and SHA-256), so when every byte
//      was written by this process the store knows both digests itself and records them: the
//      sha256 is the content key when the client names none (a trainer, which then spends no
//      pass over its checkpoint on it), and must equal the client's when it names one; a
//      crc32c the client sent must equal the store's. Otherwise (a restart during the upload)
//      the committed blob is read back and hashed, before any row says COMMITTED, and a
//      client's sha256 must match it. A mismatch discards the upload (DATA_LOSS). Then ONE
//      transaction: the row COMMITTED, a CHECKPOINT_COMMITTED job event, and retention marking the
//      job's committed checkpoints beyond keepLast DELETED. After it, and after the commit has
//      answered, their blobs and rows are removed on a thread of the manager's own (unlinking a 256
//      MiB blob takes as long as committing one); a crash in between is finished by Cleanup.
//
// Thread-safe: every method may be called from any thread. Calls on one upload are serialized
// by a lock of that upload; everything else is PostgreSQL's concurrency.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gradhub/v1/checkpoint.pb.h"
#include "services/checkpoint/blob_store.h"
#include "services/checkpoint/checkpoint_access.h"
#include "services/checkpoint/checkpoint_metrics.h"
#include "services/checkpoint/checkpoint_records.h"
#include "services/checkpoint/hashing_read_ahead.h"
#include "services/checkpoint/transfer_slots.h"
#include "services/common/db/pool.h"
#include "services/common/direct_write.h"
#include "services/common/ordered_worker.h"
#include "services/common/sha256.h"

namespace gradhub::checkpoint {

struct CheckpointManagerOptions {
  // Announced by StartUpload: the most data one UploadChunkRequest may carry; also the size of
  // download chunks.
  int32_t chunk_size_bytes = 1 << 20;
  // Uploads without a commit and without a written byte for this long are discarded.
  absl::Duration upload_ttl = absl::Hours(1);
  // Transfers (upload streams, downloads) served at once, in all and per caller
  // (transfer_slots.h); beyond either, RESOURCE_EXHAUSTED. Each holds up to about 12 MiB of
  // buffers.
  int max_transfers = 64;
  int max_transfers_per_caller = 16;
};

// What one Cleanup pass did, for the log.
struct CleanupReport {
  int orphan_uploads = 0;  // upload files without an UPLOADING row, removed
  int stale_uploads = 0;   // uploads past the TTL, discarded with their rows
  int orphan_blobs = 0;    // blobs without a COMMITTED row (crash before the row, BAD), removed
  int missing_blobs = 0;   // COMMITTED rows whose blob was gone, marked BAD
  int deleted_rows = 0;    // rows marked DELETED whose blobs and rows were removed
  std::string ToString() const;
};

struct ScrubReport {
  int checked = 0;
  int64_t bytes = 0;
  int bad = 0;  // marked BAD (mismatch or missing)
  std::string ToString() const;
};

class CheckpointManager;

// One UploadChunks stream's writes to one upload, authorized once when opened. Not
// thread-safe; one per stream. Chunks are gathered into batches, and the batches are written
// in order on a thread of the writer's own (an OrderedWorker), so the stream receives the next
// chunks while a batch goes to disk:
//   1. Write(offset, chunk, crc32c), on the stream's thread (which mostly waits for the
//      network): copies the chunk into the batch being filled (block-aligned memory, which a
//      store that writes around the page cache sends to the device as it is) and checks the
//      crc32c of that copy, so the check covers the bytes the store gets. A chunk whose crc32c
//      differs is left out and ends the stream with DATA_LOSS once the batch before it is
//      written. Returns the first error of a batch written before, if any;
//   2. a batch goes to the thread when it holds kBatchBytes, when the next chunk does not
//      continue it, and at Finish; the thread appends each batch at its offset (WriteNow);
//      after an error it drops what is queued behind it. One batch is written while the next
//      fills: Write blocks while a full batch waits for the one being written;
//   3. Finish() waits for the queue and answers the contiguous bytes held, or that first error.
// WriteNow's answers: OUT_OF_RANGE for a gap or for bytes beyond the declared size;
// FAILED_PRECONDITION once the upload is committed (an empty chunk, a probe, then answers its
// size); NOT_FOUND once it was discarded.
class UploadWriter {
 public:
  // Bigger appends keep the device busier: 4 MiB direct writes ran 10-25% faster than 1 MiB
  // ones here (dd), and a batch costs one open and one stat of the upload file.
  static constexpr size_t kBatchBytes = 4 << 20;

  // `crc32c`: of `data`, when the client sent one (UploadChunkRequest.crc32c).
  absl::Status Write(int64_t offset, std::string data, std::optional<uint32_t> crc32c);
  absl::StatusOr<int64_t> Finish();
  const std::string& upload_id() const { return row_.upload_id; }

 private:
  friend class CheckpointManager;
  // What this process knows of one upload beyond its row: the bytes the blob store holds and
  // whether this process digested all of them. `mu` serializes the upload's writes, its commit
  // and its discarding.
  struct UploadState {
    absl::Mutex mu;
    bool loaded = false;  // `held` was read from the blob store
    int64_t held = 0;
    // Every byte of [0, held) was written by this process, in order, and digested on the way:
    // `crc32c` (combined from the chunks' own where they carried one, which Write checked,
    // else computed) and `sha256`. The commit records these, so it reads nothing back, and a
    // trainer that names no sha256 spends no pass over its checkpoint on one. Cleared for good
    // by bytes this process did not write (a restart, a failed write): the commit then reads
    // the blob back and hashes it.
    bool digested = true;
    uint32_t crc32c = 0;
    Sha256Stream sha256;
    bool committed = false;
    bool discarded = false;
    absl::Time last_write = absl::InfinitePast();  // of this process's last append

    // What the blob store says it holds. More or fewer bytes than this process wrote (a
    // restart, a failed write) are bytes it did not digest.
    void Reload(int64_t bytes) {
      if (bytes != held) digested = false;
      held = bytes;
      loaded = true;
    }
  };
  UploadWriter(CheckpointManager* manager, CheckpointRow row, std::shared_ptr<UploadState> state,
               TransferSlots::Slot slot)
      : manager_(manager), row_(std::move(row)), state_(std::move(state)), slot_(std::move(slot)) {}
  // Contiguous bytes from `offset`; `checked`: every chunk in it came with a crc32c that
  // matched.
  struct Batch {
    int64_t offset = 0;
    AlignedBuffer bytes;
    bool checked = true;
    uint32_t crc32c = 0;  // of `bytes` while `checked`, combined from its chunks' (no 2nd pass)
  };
  // Hands the batch being filled to the thread.
  void Flush();
  // Queues `task` for the thread unless an earlier one failed; its outcome becomes result_.
  void Queue(size_t bytes, std::function<absl::StatusOr<int64_t>()> task);
  // `crc32c`: of `data`, every chunk of which came with a crc32c that matched; none otherwise.
  absl::StatusOr<int64_t> WriteNow(int64_t offset, std::string_view data,
                                   std::optional<uint32_t> crc32c);
  absl::Status CrcMismatch(int64_t offset, int64_t end, uint32_t sent, uint32_t received);

  CheckpointManager* manager_;
  CheckpointRow row_;
  std::shared_ptr<UploadState> state_;
  TransferSlots::Slot slot_;  // held while the stream runs
  // The outcome of the last chunk written: held bytes, or the first error (then final).
  absl::Mutex result_mu_;
  absl::StatusOr<int64_t> result_ ABSL_GUARDED_BY(result_mu_) = 0;
  std::shared_ptr<Batch> filling_;  // the stream's thread only
  // Written batches, their memory reused for the next ones.
  absl::Mutex spare_mu_;
  std::vector<std::shared_ptr<Batch>> spare_ ABSL_GUARDED_BY(spare_mu_);
  // One batch queued or being written at a time (besides the one filling).
  OrderedWorker worker_{kBatchBytes};  // declared last: drained and joined first
};

// One download of one committed checkpoint. Not thread-safe; one per call.
class CheckpointDownload {
 public:
  const v1::Checkpoint& checkpoint() const { return row_.proto; }
  // Where the next chunk starts.
  int64_t offset() const { return position_; }
  // The next chunk (at most the chunk size) into *data, empty at the end. Every byte of the
  // blob is checked, those before the starting offset included, on threads that read ahead
  // (hashing_read_ahead.h); the last chunk is handed out only once the whole blob matched the
  // crc32c recorded at its commit (its sha256 when there is none) and, when the download was
  // opened with verify_sha256, its sha256: otherwise DATA_LOSS, and the checkpoint is marked
  // BAD with a CHECKPOINT_CORRUPT event.
  absl::Status Next(std::string* data);

 private:
  friend class CheckpointManager;
  CheckpointDownload(CheckpointManager* manager, CheckpointRow row, TransferSlots::Slot slot)
      : manager_(manager), row_(std::move(row)), slot_(std::move(slot)) {}
  // Hashes [0, offset) without handing it out (a resumed download).
  absl::Status Skip(int64_t offset);
  // The next chunk read ahead; a short blob is corruption.
  absl::Status Take(std::string* data);
  absl::Status Corrupt(const std::string& reason);

  CheckpointManager* manager_;
  CheckpointRow row_;
  TransferSlots::Slot slot_;  // held while the download runs
  std::unique_ptr<HashingReadAhead> ahead_;
  std::string skipped_tail_;  // bytes of a chunk past the starting offset, handed out first
  int64_t position_ = 0;
  bool check_sha256_ = false;  // besides the crc32c
  bool verified_ = false;      // the whole blob was checked and matched
};

class CheckpointManager {
 public:
  // Not owned; all must outlive the manager. `metrics` may be null.
  CheckpointManager(db::Pool* pool, BlobStore* blobs, CheckpointMetrics* metrics,
                    CheckpointManagerOptions options = {});
  ~CheckpointManager();

  // Step 1. INVALID_ARGUMENT naming a bad field; ALREADY_EXISTS for a step already committed
  // or a request_id used for another upload; access as in checkpoint_access.h.
  absl::StatusOr<v1::StartUploadResponse> StartUpload(const Caller& caller,
                                                      const v1::StartUploadRequest& request);

  // Step 2: a writer for `upload_id`. NOT_FOUND for an unknown or discarded upload.
  absl::StatusOr<std::unique_ptr<UploadWriter>> OpenUpload(const Caller& caller,
                                                           const std::string& upload_id);

  // Step 3, as CommitCheckpoint in checkpoint.proto. Idempotent.
  absl::StatusOr<v1::Checkpoint> Commit(const Caller& caller,
                                        const v1::CommitCheckpointRequest& request);

  // The COMMITTED checkpoint `name` from `offset`. NOT_FOUND when there is none; DATA_LOSS for
  // one marked BAD; OUT_OF_RANGE for an offset beyond its end. `verify_sha256`: as
  // DownloadCheckpointRequest.verify_sha256.
  absl::StatusOr<std::unique_ptr<CheckpointDownload>> OpenDownload(const Caller& caller,
                                                                   const std::string& name,
                                                                   int64_t offset,
                                                                   bool verify_sha256 = false);

  // Newest step first, paged like ListJobs; filter `state=UPLOADING|COMMITTED|BAD`.
  absl::StatusOr<v1::ListCheckpointsResponse> List(const Caller& caller,
                                                   const v1::ListCheckpointsRequest& request);

  // The COMMITTED checkpoint with the highest step, or NOT_FOUND.
  absl::StatusOr<v1::Checkpoint> GetLatest(const Caller& caller, const std::string& job);

  // Deletes the committed (or BAD) checkpoint `name`, row and blob. NOT_FOUND if absent.
  absl::Status Delete(const Caller& caller, const std::string& name);

  // Brings rows and blobs into agreement after a crash, and discards stale uploads; at start-up
  // and then periodically (checkpoint_maintenance.cc).
  absl::StatusOr<CleanupReport> Cleanup();

  // Hashes every COMMITTED blob and marks those that do not match (or are missing) BAD.
  // Returns early, with what it did, once `stop()` is true (checked between blobs).
  absl::StatusOr<ScrubReport> Scrub(const std::function<bool()>& stop = [] { return false; });

  // OK when the database answers and the schema is migrated (for /readyz).
  absl::Status CheckReady();

  // Waits until the checkpoints retired by earlier commits are removed, blob and row.
  void WaitForRemovals() { removals_.Drain(); }

  const CheckpointManagerOptions& options() const { return options_; }
  // Shared with the code store (code_store.h): one budget for every transfer of this process.
  TransferSlots& transfer_slots() { return transfers_; }

 private:
  friend class UploadWriter;
  friend class CheckpointDownload;
  using UploadState = UploadWriter::UploadState;

  // The in-memory state of an upload, made on first use.
  std::shared_ptr<UploadState> State(const std::string& upload_id);
  void ForgetState(const std::string& upload_id);
  absl::StatusOr<CheckpointRow> ReadUpload(const std::string& upload_id);
  // Removes an upload for good: row, upload bytes, blob (if committed to the store already).
  absl::Status Discard(const CheckpointRow& row, UploadState& state);
  // `client_sha256`: as the request names it, "" for none.
  absl::StatusOr<v1::Checkpoint> CommitLocked(const CheckpointRow& row,
                                              const std::string& client_sha256,
                                              std::optional<uint32_t> client_crc32c,
                                              UploadState& state);
  // CommitLocked's steps (checkpoint_manager.cc says what each does).
  absl::StatusOr<bool> PlaceBlob(const CheckpointRow& row, UploadState& state);
  // The digests a commit records: the sha256 (the client's, or the store's own when the
  // client named none), the crc32c, and whether that crc32c is of the bytes the sha256 names.
  struct RecordedDigests {
    std::string sha256;
    uint32_t crc32c = 0;
    bool crc32c_covers_sha256 = false;
  };
  absl::StatusOr<RecordedDigests> VerifiedDigests(const CheckpointRow& row,
                                                  const std::string& client_sha256,
                                                  std::optional<uint32_t> client_crc32c,
                                                  UploadState& state, bool digested);
  // Discards the upload: what the client claimed (`claim`: its sha256, or the declared size)
  // is not what was `received`; DATA_LOSS saying both.
  absl::Status Sha256Mismatch(const CheckpointRow& row, UploadState& state,
                              const std::string& claim, const std::string& received);
  void RemoveAfterCommit(std::vector<CheckpointRow> retired,
                         const std::vector<CheckpointRow>& abandoned);
  // Reads a committed blob whole (through a HashingReadAhead, as downloads do): its size,
  // sha256 and crc32c. DATA_LOSS when it ends before the size it had when opened.
  struct HashedBlob {
    int64_t size = 0;
    BlobDigests digests;
  };
  absl::StatusOr<HashedBlob> HashBlob(const std::string& blob_key);
  // Step 5's transaction. *retired: checkpoints retention marked DELETED; *abandoned: the
  // uploads this commit superseded, whose rows it deleted (checkpoint.proto, StartUpload).
  absl::StatusOr<v1::Checkpoint> WriteCommittedRow(const CheckpointRow& row,
                                                   const RecordedDigests& digests,
                                                   std::vector<CheckpointRow>* retired,
                                                   std::vector<CheckpointRow>* abandoned);
  // Removes the blobs and rows of checkpoints marked DELETED.
  int RemoveDeleted(const std::vector<CheckpointRow>& rows);
  void Failure(std::string_view reason);
  void FoundBad(std::string_view found_by);
  // A transfer slot for `caller`, already authorized; RESOURCE_EXHAUSTED is counted as a failure.
  absl::StatusOr<TransferSlots::Slot> AcquireTransfer(const Caller& caller);

  // Cleanup steps (checkpoint_maintenance.cc).
  absl::Status CleanupUploads(CleanupReport* report);
  absl::Status CleanupBlobs(CleanupReport* report);
  absl::Status CleanupDeleted(CleanupReport* report);
  absl::Status ScrubOne(const CheckpointRow& row, ScrubReport* report);

  db::Pool* pool_;
  BlobStore* blobs_;
  CheckpointMetrics* metrics_;
  const CheckpointManagerOptions options_;
  TransferSlots transfers_;

  absl::Mutex states_mu_;
  std::unordered_map<std::string, std::shared_ptr<UploadState>> states_ ABSL_GUARDED_BY(states_mu_);
  // Retention's removals (RemoveDeleted), one batch per commit; beyond kQueuedRemovals batches
  // a commit waits. Last member: its destructor runs what is queued while the rest still
  // exists.
  static constexpr size_t kQueuedRemovals = 64;
  OrderedWorker removals_{kQueuedRemovals};
};

}  // namespace gradhub::checkpoint
