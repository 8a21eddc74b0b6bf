// Who the checkpoint store's BlobStore keys belong to (data_keys.h's BlobScopes), read from
// PostgreSQL, for SealedBlobStore:
//   - a checkpoint's upload "<upload id>" and its blob "<job id>/<step>-<upload id>" (the
//     checkpoints row's blob_path): the job's tenant, and the blob key as the identity, so a
//     blob copied over another job's (or another step's) fails its tags;
//   - code archives, uploads "code-<hex>" and blobs "code/<sha256>": the platform's key and
//     the identity "code". An archive is kept once for every tenant that uploaded the same
//     bytes (code_store.h), so it cannot be sealed under one tenant's key; its name is its
//     sha256, which every download and the scrub check before the last chunk goes out.
// Thread-safe (each call one query on the pool).
#pragma once

#include <string>

#include "services/checkpoint/data_keys.h"
#include "services/common/db/pool.h"

namespace gradhub::checkpoint {

inline constexpr char kCodeIdentity[] = "code";

class CheckpointBlobScopes final : public BlobScopes {
 public:
  // Not owned; must outlive this.
  explicit CheckpointBlobScopes(db::Pool* pool) : pool_(pool) {}

  // NOT_FOUND for an upload id without a checkpoint row.
  absl::StatusOr<BlobScope> OfUpload(const std::string& upload) override;
  // NOT_FOUND for a blob key of no job.
  absl::StatusOr<BlobScope> OfBlob(const std::string& blob) override;

 private:
  db::Pool* const pool_;
};

}  // namespace gradhub::checkpoint
