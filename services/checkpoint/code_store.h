// The code store: archives of script jobs' code (proto/gradhub/v1/code.proto), kept by
// gradhub-checkpoint in the same BlobStore as the checkpoints (so the same durability, transfer
// slots and scrub), one blob per sha256 and one row per (tenant, sha256) in `code_archives`.
// The gRPC and REST adapters (code_service.h, code_rest.h) authenticate, make one call here and
// map the status.
//
// Keys in the BlobStore: an upload in progress is "code-<32 hex>", a kept archive the blob
// "code/<sha256>" (blob_store.h: the checkpoints' cleanup leaves both to this store).
//
// Uploading one archive (UploadCode):
//   1. StartUpload(caller, header): tenants only; the header's size within --max-code-bytes,
//      refused before a byte is read; its sha256, when given, 64 hex characters; a transfer
//      slot, shared with the checkpoints (transfer_slots.h).
//   2. CodeUpload::Write(data), the pieces in order: each is fed to the ArchiveChecker (the
//      first bad entry ends the upload), to a SHA-256 on a thread of its own, and into 4 MiB
//      batches that another thread appends to the BlobStore upload while the stream receives
//      the next pieces.
//   3. CodeUpload::Finish(): the size against the header's, the checker's verdict on the
//      whole archive, the sha256 against the header's (DATA_LOSS). Then, with the blob's key
//      held against removal: a blob code/<sha256> of that size already there is kept and the
//      upload dropped; otherwise BlobStore::Commit makes the upload durable and visible
//      (fsync, rename, fsync of the directory). Last, the (tenant, sha256) row (INSERT ... ON
//      CONFLICT DO NOTHING), which the answer is read from: the same bytes again, by the same
//      tenant, get the same answer.
//   Any failure, and a CodeUpload destroyed before Finish (a broken stream), discards the
//   upload: no bytes are kept and no row is written.
//
// Reading (GetCode, DownloadCode): a tenant sees its own rows only (another tenant's archive is
// NOT_FOUND, even when the bytes are the same); the node token and the admin token see every
// archive that has a row. Script ranks (job tokens) get PERMISSION_DENIED for everything. A
// download checks the archive's sha256 as it reads it, and hands out its last chunk only once
// the whole matched.
//
// Removal: a blob found corrupt (by a download or the scrub) or missing goes with every row of
// its digest, so that GetCode answers NOT_FOUND and the client uploads it again. The cleanup
// removes blobs without a row (a crash before the row; tenants deleted) and uploads that a
// previous life of the process left.
//
// Thread-safe: every CodeStore method may be called from any thread. A CodeUpload and a
// CodeDownload are used by one thread at a time.
#pragma once

#include <algorithm>
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
#include "gradhub/v1/code.pb.h"
#include "services/checkpoint/blob_store.h"
#include "services/checkpoint/checkpoint_access.h"
#include "services/checkpoint/checkpoint_metrics.h"
#include "services/checkpoint/hashing_read_ahead.h"
#include "services/checkpoint/transfer_slots.h"
#include "services/common/background_sha256.h"
#include "services/common/code_archive/code_archive.h"
#include "services/common/db/pool.h"
#include "services/common/direct_write.h"
#include "services/common/ordered_worker.h"

namespace gradhub::checkpoint {

struct CodeStoreOptions {
  // --max-code-bytes, --max-code-unpacked-bytes, --max-code-entries.
  code::ArchiveLimits limits;
  // Uploads that no process is writing and that were not written to for this long are
  // removed by the cleanup.
  absl::Duration upload_ttl = absl::Hours(1);
  // Where removals of corrupt or missing archives are reported (the server's log); may be null.
  std::function<void(const std::string& line)> log;
};

// The most data a download hands out at once (code.proto: chunks of at most 1 MiB).
inline constexpr size_t kCodeDownloadChunkBytes = 1 << 20;

struct CodeCleanupReport {
  int stale_uploads = 0;  // uploads of a previous life, removed
  int orphan_blobs = 0;   // blobs without a row, removed
  std::string ToString() const;
};

struct CodeScrubReport {
  int checked = 0;
  int64_t bytes = 0;
  // "code/<sha256>: <why>", each removed with its rows (unless an upload held it meanwhile).
  std::vector<std::string> corrupt;
  std::string ToString() const;
};

// Keys of the BlobStore that an upload of this process is writing or placing, which removal
// must leave alone. Thread-safe.
class KeysInUse {
 public:
  // Holds its key until destroyed. Move-only.
  class Hold {
   public:
    Hold() = default;
    Hold(Hold&& other) noexcept;
    Hold& operator=(Hold&& other) noexcept;
    ~Hold();

   private:
    friend class KeysInUse;
    Hold(KeysInUse* keys, std::string key) : keys_(keys), key_(std::move(key)) {}
    KeysInUse* keys_ = nullptr;
    std::string key_;
  };

  Hold Take(const std::string& key);
  // Runs `remove` under the lock unless `key` is held (then false), so that no upload takes the
  // key while it runs.
  bool RunUnlessHeld(const std::string& key, const std::function<void()>& remove);

 private:
  void Release(const std::string& key);

  absl::Mutex mu_;
  std::unordered_map<std::string, int> held_ ABSL_GUARDED_BY(mu_);
};

// Bytes streamed in order into one BlobStore upload, hashed on the way, on two threads of its
// own: a SHA-256 (BackgroundSha256) and a writer that appends 4 MiB batches while the caller
// gathers the next. Not thread-safe; one per upload. Its first error is final.
class HashingBlobSink {
 public:
  HashingBlobSink(BlobStore* blobs, std::string upload_key)
      : blobs_(blobs), upload_key_(std::move(upload_key)) {}
  ~HashingBlobSink();  // waits for the writing thread
  HashingBlobSink(const HashingBlobSink&) = delete;
  HashingBlobSink& operator=(const HashingBlobSink&) = delete;

  // Takes the next piece; returns the first error of an append before, if any.
  absl::Status Append(std::string data);
  // Waits for every append: the sha256 (lowercase hex) of all the bytes, or the first error.
  absl::StatusOr<std::string> Finish();
  const std::string& upload_key() const { return upload_key_; }

 private:
  struct Batch {
    int64_t offset = 0;
    AlignedBuffer bytes;
  };
  static constexpr size_t kBatchBytes = 4 << 20;
  // Hands the batch being filled to the writing thread.
  void Flush();
  absl::Status status();

  BlobStore* const blobs_;
  const std::string upload_key_;
  int64_t appended_ = 0;            // bytes taken so far
  std::shared_ptr<Batch> filling_;  // the caller's thread's
  absl::Mutex mu_;
  std::shared_ptr<Batch> spare_ ABSL_GUARDED_BY(mu_);  // written, its memory to reuse
  absl::Status status_ ABSL_GUARDED_BY(mu_);           // the first error of a write
  BackgroundSha256 sha256_;
  OrderedWorker writer_{kBatchBytes};  // declared last: drained and joined first
};

class CodeStore;

// Steps 2 and 3 of one upload. Not thread-safe; one per stream.
class CodeUpload {
 public:
  ~CodeUpload();  // discards what Finish did not keep
  CodeUpload(const CodeUpload&) = delete;
  CodeUpload& operator=(const CodeUpload&) = delete;

  // The next piece of the archive. INVALID_ARGUMENT naming the entry the checker refused,
  // DATA_LOSS for bytes beyond the header's size, or the BlobStore's error; each error is final.
  absl::Status Write(std::string data);
  // The archive kept, or why not (then nothing is kept).
  absl::StatusOr<v1::CodeArchive> Finish();

 private:
  friend class CodeStore;
  CodeUpload(CodeStore* store, int64_t tenant_id, v1::UploadCodeHeader header,
             TransferSlots::Slot slot, std::string upload_key);
  // The first error of the upload, then final.
  absl::Status Fail(absl::Status status);
  // The checks of step 3, before anything is kept: the archive's summary and sha256.
  struct Verified {
    code::ArchiveSummary summary;
    std::string sha256;
  };
  absl::StatusOr<Verified> Verify();

  CodeStore* store_;
  const int64_t tenant_id_;
  const v1::UploadCodeHeader header_;
  TransferSlots::Slot slot_;  // held while the stream runs
  KeysInUse::Hold hold_;      // of the upload's key: the cleanup leaves it alone
  code::ArchiveChecker checker_;
  int64_t received_ = 0;
  absl::Status failed_;  // the first error; final
  std::unique_ptr<HashingBlobSink> sink_;
};

// One download of one archive. Not thread-safe; one per call.
class CodeDownload {
 public:
  const v1::CodeArchive& archive() const { return archive_; }
  // Where the next chunk starts.
  int64_t offset() const { return std::max(taken_, start_); }
  // The next chunk (at most kCodeDownloadChunkBytes) into *data, empty at the end. The bytes
  // before the starting offset are read too, for the sha256: the last chunk comes only once the
  // whole archive matched it. Otherwise DATA_LOSS, and the archive is removed.
  absl::Status Next(std::string* data);

 private:
  friend class CodeStore;
  CodeDownload(CodeStore* store, v1::CodeArchive archive, int64_t start, TransferSlots::Slot slot,
               std::unique_ptr<HashingReadAhead> ahead)
      : store_(store),
        archive_(std::move(archive)),
        start_(start),
        slot_(std::move(slot)),
        ahead_(std::move(ahead)) {}
  // The next chunk read ahead; an archive shorter than its row says is corrupt.
  absl::Status Take(std::string* data);

  CodeStore* store_;
  const v1::CodeArchive archive_;
  const int64_t start_;       // the starting offset
  TransferSlots::Slot slot_;  // held while the download runs
  std::unique_ptr<HashingReadAhead> ahead_;
  int64_t taken_ = 0;  // bytes read from `ahead_`
  bool verified_ = false;
};

class CodeStore {
 public:
  // Not owned; all must outlive the store. `transfers`: the slots the checkpoints use too.
  // `metrics` may be null.
  CodeStore(db::Pool* pool, BlobStore* blobs, TransferSlots* transfers, CheckpointMetrics* metrics,
            CodeStoreOptions options = {});

  // Step 1. PERMISSION_DENIED for any caller but a tenant; INVALID_ARGUMENT naming the field
  // of a bad header; RESOURCE_EXHAUSTED past the transfer limits.
  absl::StatusOr<std::unique_ptr<CodeUpload>> StartUpload(const Caller& caller,
                                                          const v1::UploadCodeHeader& header);

  // `name`: "code/<sha256>" or "sha256:<sha256>" (INVALID_ARGUMENT naming `name` otherwise).
  // NOT_FOUND unless the caller may read it.
  absl::StatusOr<v1::CodeArchive> Get(const Caller& caller, const std::string& name);

  // As Get, then the archive's bytes from `offset` (OUT_OF_RANGE beyond its end). DATA_LOSS,
  // with the archive removed, when its blob is missing or has another size.
  absl::StatusOr<std::unique_ptr<CodeDownload>> OpenDownload(const Caller& caller,
                                                             const std::string& name,
                                                             int64_t offset);

  // Removes uploads of a previous life and blobs without a row (at start-up, then
  // periodically, beside CheckpointManager::Cleanup).
  absl::StatusOr<CodeCleanupReport> Cleanup();
  // Hashes every archive that has a row; removes those that no longer match (or are gone),
  // with their rows. Returns early, with what it did, once `stop()` is true.
  absl::StatusOr<CodeScrubReport> Scrub(const std::function<bool()>& stop = [] { return false; });

  const CodeStoreOptions& options() const { return options_; }

 private:
  friend class CodeUpload;
  friend class CodeDownload;

  // Step 3 once the bytes are checked: the blob placed (or found) and the row written.
  absl::StatusOr<v1::CodeArchive> Keep(const std::string& upload_key, int64_t tenant_id,
                                       const std::string& sha256,
                                       const code::ArchiveSummary& summary);
  absl::StatusOr<v1::CodeArchive> ReadRow(const std::string& sha256,
                                          std::optional<int64_t> tenant_id);
  // A reader of `archive` from `offset` (checked against its size by the caller).
  absl::StatusOr<std::unique_ptr<CodeDownload>> OpenArchive(v1::CodeArchive archive, int64_t offset,
                                                            TransferSlots::Slot slot);
  absl::StatusOr<TransferSlots::Slot> AcquireTransfer(const Caller& caller);
  absl::Status CleanupUploads(CodeCleanupReport* report);
  absl::Status CleanupBlobs(CodeCleanupReport* report);
  absl::Status ScrubOne(v1::CodeArchive archive, CodeScrubReport* report);
  // Removes every row of `sha256` and its blob for `reason`, unless an upload holds the blob
  // (then it is left for the next check). DATA_LOSS saying so, for the caller to return.
  absl::Status RemoveCorrupt(const std::string& sha256, const std::string& reason);
  void Failure(std::string_view reason);

  db::Pool* pool_;
  BlobStore* blobs_;
  TransferSlots* transfers_;
  CheckpointMetrics* metrics_;
  const CodeStoreOptions options_;
  KeysInUse in_use_;
};

// The blob key of an archive, "code/<sha256>".
std::string CodeBlobKey(const std::string& sha256);

// The sha256 (lowercase hex) that `name` names: "code/<hex>" or "sha256:<hex>", 64 hex
// characters of either case. INVALID_ARGUMENT naming `name` otherwise.
absl::StatusOr<std::string> ParseCodeName(const std::string& name);

}  // namespace gradhub::checkpoint
