// Where checkpoint bytes live: the seam between the checkpoint store's rules (CheckpointManager,
// rows in PostgreSQL) and a storage backend. Today's backend is the local filesystem
// (local_blob_store.h); the interface is shaped so that an S3-compatible one fits behind it
// unchanged: an upload is a multipart upload (Append buffers into parts, Commit is
// CompleteMultipartUpload), a blob is an object. gradhub-checkpoint wraps it in
// SealedBlobStore (sealed_blob_store.h), which encrypts every upload and blob at rest behind
// this same interface.
//
// Two namespaces of keys:
//   - uploads, written in order by Append and invisible to readers until committed; an upload
//     key is one segment of [A-Za-z0-9._-] (the service uses the upload id);
//   - blobs, immutable once committed; a blob key is such segments joined by '/'
//     (the service uses "<job id>/<step>-<upload id>").
// Any other key is INVALID_ARGUMENT.
//
// The protocol of one checkpoint, as the service drives it:
//   1. Append(upload, offset, bytes) as chunks arrive, without gaps; a resumed client first asks
//      UploadedBytes(upload) where to continue.
//   2. Commit(upload, blob) makes the whole upload durable and visible under the blob key in one
//      step, and only then does the service write the COMMITTED row. A crash before the row
//      leaves a blob without a row, which the start-up cleanup removes (ListBlobs).
//   3. Open(blob, offset) for downloads and the scrub; Delete(blob) for retention.
//   Abort(upload) discards an upload; ListUploads() finds those of a previous life.
//
// Thread-safety: every method may be called from any thread. Calls on different keys are
// independent; the caller serializes calls on one upload (the service holds a lock per upload).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace gradhub::checkpoint {

struct UploadInfo {
  std::string key;
  int64_t bytes = 0;
  absl::Time last_write;  // of the last Append (the file's mtime for the local backend)
};

struct BlobInfo {
  std::string key;
  int64_t bytes = 0;
};

// Sequential reads of one committed blob. Not thread-safe; one per reader.
class BlobReader {
 public:
  virtual ~BlobReader() = default;
  // Replaces *out with up to `max_bytes` from the current position and advances it; *out is
  // empty at the end of the blob.
  virtual absl::Status Read(size_t max_bytes, std::string* out) = 0;
  // Of the whole blob, whatever the starting offset.
  virtual int64_t size() const = 0;
};

class BlobStore {
 public:
  virtual ~BlobStore() = default;

  // Writes `data` at `offset` of the upload and returns the bytes it holds afterwards (all
  // contiguous from 0). An upload that does not exist holds 0 bytes; an append at offset 0
  // creates it (an empty one when `data` is empty). OUT_OF_RANGE, with nothing written, when
  // `offset` is beyond the bytes held (a gap). Bytes before the end that arrive again are
  // ignored: the first copy stays (the service's sha256 check guards against them differing).
  virtual absl::StatusOr<int64_t> Append(const std::string& upload, int64_t offset,
                                         std::string_view data) = 0;

  // Contiguous bytes held from 0; 0 for an upload that does not exist.
  virtual absl::StatusOr<int64_t> UploadedBytes(const std::string& upload) = 0;

  // Makes the upload durable and visible as `blob` atomically (a reader sees all of it or
  // nothing), replacing a blob of that key, and ends the upload. When the upload no longer
  // exists but the blob does, the commit already happened: OK (retries are safe). NOT_FOUND
  // when neither exists.
  virtual absl::Status Commit(const std::string& upload, const std::string& blob) = 0;

  // Discards an upload. Idempotent.
  virtual absl::Status Abort(const std::string& upload) = 0;

  // A reader of a committed blob positioned at `offset`. NOT_FOUND for a missing blob,
  // OUT_OF_RANGE for an offset beyond its end (offset == size reads nothing).
  virtual absl::StatusOr<std::unique_ptr<BlobReader>> Open(const std::string& blob,
                                                           int64_t offset) = 0;

  // Size of a committed blob, or NOT_FOUND.
  virtual absl::StatusOr<int64_t> BlobSize(const std::string& blob) = 0;

  // Removes a committed blob. Idempotent.
  virtual absl::Status Delete(const std::string& blob) = 0;

  // Every upload and every blob, in no particular order, for the start-up cleanup.
  virtual absl::StatusOr<std::vector<UploadInfo>> ListUploads() = 0;
  virtual absl::StatusOr<std::vector<BlobInfo>> ListBlobs() = 0;
};

// INVALID_ARGUMENT unless `key` is a valid upload key (`is_blob` false) or blob key.
absl::Status CheckBlobKey(std::string_view key, bool is_blob);

// The code store's keys (code_store.h): uploads "code-<hex>", archives "code/<sha256>". No
// checkpoint's key starts so (theirs are uuids), and the checkpoints' cleanup leaves them alone.
inline constexpr char kCodeUploadPrefix[] = "code-";
inline constexpr char kCodeBlobPrefix[] = "code/";
inline bool IsCodeKey(std::string_view key) {
  return key.substr(0, 5) == kCodeUploadPrefix || key.substr(0, 5) == kCodeBlobPrefix;
}

}  // namespace gradhub::checkpoint
