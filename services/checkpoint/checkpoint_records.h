// The checkpoint row as the store's code reads it, its proto, names, and the one way a
// checkpoint becomes BAD. Shared by the manager's calls, the download path and the cleanup.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "gradhub/v1/checkpoint.pb.h"
#include "services/common/db/pool.h"

namespace gradhub::checkpoint {

// SELECT list over `checkpoints c` for CheckpointFromRow.
extern const char kCheckpointColumns[];

struct CheckpointRow {
  int64_t id = 0;
  std::string job_id;     // uuid
  std::string upload_id;  // uuid
  std::string blob_key;   // BlobKey(...), in the blob store
  std::string state;      // UPLOADING, COMMITTED, BAD, DELETED
  std::string sha256;     // hex; empty until committed
  // Of the blob, recorded at the commit; none before it, and for checkpoints committed before
  // the store recorded it (migration 0008).
  std::optional<uint32_t> crc32c;
  // `crc32c` is of the bytes the sha256 names (migration 0019): then proto.crc32c is set.
  bool crc32c_covers_sha256 = false;
  int32_t attempt = 0;
  int64_t step = 0;
  int64_t size_bytes = 0;
  std::string request_id;
  std::string bad_reason;  // BAD only
  v1::Checkpoint proto;
};

absl::StatusOr<CheckpointRow> CheckpointFromRow(const db::Row& row);

// "jobs/{uuid}/checkpoints/{step}".
std::string CheckpointName(const std::string& job_id, int64_t step);

struct ParsedName {
  std::string job_id;
  int64_t step = 0;
};
// NOT_FOUND for a name that is not jobs/{uuid}/checkpoints/{step}: a malformed name names
// nothing, and must not reach SQL as a cast error.
absl::StatusOr<ParsedName> ParseCheckpointName(const std::string& name);

// Where a checkpoint's bytes live once committed: one key per upload, so that a step written
// again (after a BAD one) never meets the old blob.
std::string BlobKey(const std::string& job_id, int64_t step, const std::string& upload_id);

// Whether `text` is 64 lowercase hex characters.
bool IsSha256Hex(const std::string& text);

// Whether `text` is a uuid as PostgreSQL prints it (lowercase, dashed).
bool IsUuid(const std::string& text);

// Marks COMMITTED checkpoint `id` BAD for `reason` and records a CHECKPOINT_CORRUPT event, in
// one transaction. False when the row was no longer COMMITTED (deleted or marked meanwhile):
// then nothing is written.
absl::StatusOr<bool> MarkBad(db::Pool& pool, int64_t id, const std::string& reason);

}  // namespace gradhub::checkpoint
