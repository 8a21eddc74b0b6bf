// CheckpointManager's housekeeping: the cleanup that brings rows and blobs back into agreement
// after a crash, and the scrub that finds blobs that rotted on disk.
//
// Why the cleanup cannot remove something in use: it lists the blob store first and reads the
// rows after. Every upload file and blob is made after its row (StartUpload inserts the row
// before a byte is accepted), so whatever the listing saw had its row by then; a row gone by the
// time it is read means the upload was discarded or deleted, and its bytes are garbage.
#include <unordered_map>
#include <unordered_set>

#include "absl/strings/str_cat.h"
#include "services/checkpoint/checkpoint_manager.h"
#include "services/common/status_macros.h"

namespace gradhub::checkpoint {
namespace {

absl::StatusOr<std::vector<CheckpointRow>> Rows(db::Pool& pool, const std::string& where,
                                                absl::Span<const db::Param> params = {}) {
  GRADHUB_ASSIGN_OR_RETURN(
      db::Result rows,
      pool.Exec(absl::StrCat("SELECT ", kCheckpointColumns, " FROM checkpoints c WHERE ", where),
                params));
  std::vector<CheckpointRow> out;
  for (const db::Row& r : rows) {
    GRADHUB_ASSIGN_OR_RETURN(CheckpointRow row, CheckpointFromRow(r));
    out.push_back(std::move(row));
  }
  return out;
}

absl::Time CreateTime(const CheckpointRow& row) {
  return absl::FromUnixSeconds(row.proto.create_time().seconds()) +
         absl::Nanoseconds(row.proto.create_time().nanos());
}

}  // namespace

absl::StatusOr<CleanupReport> CheckpointManager::Cleanup() {
  CleanupReport report;
  GRADHUB_RETURN_IF_ERROR(CleanupUploads(&report));
  GRADHUB_RETURN_IF_ERROR(CleanupBlobs(&report));
  GRADHUB_RETURN_IF_ERROR(CleanupDeleted(&report));
  return report;
}

// Upload files without an UPLOADING row, and uploads past the TTL.
absl::Status CheckpointManager::CleanupUploads(CleanupReport* report) {
  GRADHUB_ASSIGN_OR_RETURN(const std::vector<UploadInfo> files, blobs_->ListUploads());
  GRADHUB_ASSIGN_OR_RETURN(const std::vector<CheckpointRow> uploading,
                           Rows(*pool_, "c.state = 'UPLOADING'"));
  std::unordered_map<std::string, const CheckpointRow*> rows;
  for (const CheckpointRow& row : uploading) rows[row.upload_id] = &row;
  std::unordered_map<std::string, absl::Time> last_write;
  for (const UploadInfo& file : files) {
    if (IsCodeKey(file.key)) continue;  // the code store's (code_store.h)
    if (rows.count(file.key) > 0) {
      last_write[file.key] = file.last_write;
    } else if (blobs_->Abort(file.key).ok()) {
      ++report->orphan_uploads;
    }
  }
  const absl::Time now = absl::Now(), cutoff = now - options_.upload_ttl;
  for (const CheckpointRow& row : uploading) {
    // Idle means: created, and last written to (by this process or, before a restart, any),
    // longer than the TTL ago.
    auto written = last_write.find(row.upload_id);
    if (CreateTime(row) > cutoff || (written != last_write.end() && written->second > cutoff)) {
      continue;
    }
    std::shared_ptr<UploadState> state = State(row.upload_id);
    absl::MutexLock lock(&state->mu);
    if (state->discarded || state->committed || state->last_write > cutoff) continue;
    if (Discard(row, *state).ok()) ++report->stale_uploads;
  }
  return absl::OkStatus();
}

// Blobs of no row that may still need them (committed, uploading, or marked DELETED, which
// CleanupDeleted handles), and COMMITTED rows whose blob is gone.
absl::Status CheckpointManager::CleanupBlobs(CleanupReport* report) {
  GRADHUB_ASSIGN_OR_RETURN(const std::vector<BlobInfo> blobs, blobs_->ListBlobs());
  GRADHUB_ASSIGN_OR_RETURN(const std::vector<CheckpointRow> rows,
                           Rows(*pool_, "c.state IN ('COMMITTED', 'UPLOADING', 'DELETED')"));
  std::unordered_set<std::string> wanted, listed;
  for (const CheckpointRow& row : rows) wanted.insert(row.blob_key);
  for (const BlobInfo& blob : blobs) {
    if (IsCodeKey(blob.key)) continue;  // the code store's (code_store.h)
    listed.insert(blob.key);
    if (wanted.count(blob.key) == 0 && blobs_->Delete(blob.key).ok()) ++report->orphan_blobs;
  }
  for (const CheckpointRow& row : rows) {
    if (row.state != "COMMITTED" || listed.count(row.blob_key) > 0) continue;
    // Committed after the listing, perhaps: ask for this one blob before believing it gone.
    if (!absl::IsNotFound(blobs_->BlobSize(row.blob_key).status())) continue;
    GRADHUB_ASSIGN_OR_RETURN(const bool marked, MarkBad(*pool_, row.id, "its blob is missing"));
    if (marked) {
      ++report->missing_blobs;
      FoundBad("cleanup");
    }
  }
  return absl::OkStatus();
}

// What retention or DeleteCheckpoint marked but could not finish.
absl::Status CheckpointManager::CleanupDeleted(CleanupReport* report) {
  GRADHUB_ASSIGN_OR_RETURN(const std::vector<CheckpointRow> rows,
                           Rows(*pool_, "c.state = 'DELETED'"));
  report->deleted_rows += RemoveDeleted(rows);
  return absl::OkStatus();
}

absl::StatusOr<ScrubReport> CheckpointManager::Scrub(const std::function<bool()>& stop) {
  // In pages by id, so a large store is never read into memory at once and checkpoints
  // committed during the scrub are checked by the next one.
  constexpr int64_t kPage = 100;
  ScrubReport report;
  int64_t after = 0;
  while (true) {
    GRADHUB_ASSIGN_OR_RETURN(
        const std::vector<CheckpointRow> page,
        Rows(*pool_, "c.state = 'COMMITTED' AND c.id > $1 ORDER BY c.id LIMIT $2", {after, kPage}));
    for (const CheckpointRow& row : page) {
      if (stop()) return report;
      GRADHUB_RETURN_IF_ERROR(ScrubOne(row, &report));
      after = row.id;
    }
    if (static_cast<int64_t>(page.size()) < kPage) return report;
  }
}

absl::Status CheckpointManager::ScrubOne(const CheckpointRow& row, ScrubReport* report) {
  absl::StatusOr<HashedBlob> blob = HashBlob(row.blob_key);
  std::string reason;
  if (absl::IsNotFound(blob.status())) {
    reason = "its blob is missing";
  } else if (absl::IsDataLoss(blob.status())) {
    reason = std::string(blob.status().message());  // it shrank while being read
  } else if (!blob.ok()) {
    return blob.status();
  } else if (blob->size != row.size_bytes) {
    reason = absl::StrCat("its blob has ", blob->size, " bytes instead of ", row.size_bytes);
  } else if (blob->digests.sha256 != row.sha256) {
    reason = "its blob no longer matches its sha256 (found by the scrub)";
  } else if (row.crc32c.has_value() && blob->digests.crc32c != *row.crc32c) {
    // Downloads check the crc32c: one that does not match would fail every one of them.
    reason = "its blob no longer matches its crc32c (found by the scrub)";
  }
  ++report->checked;
  if (blob.ok()) report->bytes += blob->size;
  if (reason.empty() && !row.crc32c_covers_sha256) {
    // Hashed whole just now: its crc32c covers the sha256 from here on, so its downloads need
    // no SHA-256 either (a row that changed meanwhile is left alone).
    return pool_
        ->Exec(
            "UPDATE checkpoints SET crc32c = $2, crc32c_covers_sha256 = true"
            " WHERE id = $1 AND state = 'COMMITTED'",
            {row.id, static_cast<int64_t>(blob->digests.crc32c)})
        .status();
  }
  if (reason.empty()) return absl::OkStatus();
  GRADHUB_ASSIGN_OR_RETURN(const bool marked, MarkBad(*pool_, row.id, reason));
  if (marked) {
    ++report->bad;
    FoundBad("scrub");
  }
  return absl::OkStatus();
}

}  // namespace gradhub::checkpoint
