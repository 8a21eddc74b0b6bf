#include "services/checkpoint/blob_scopes.h"

#include "absl/strings/str_cat.h"
#include "services/checkpoint/blob_store.h"
#include "services/checkpoint/checkpoint_records.h"
#include "services/common/status_macros.h"

namespace gradhub::checkpoint {

absl::StatusOr<BlobScope> CheckpointBlobScopes::OfUpload(const std::string& upload) {
  if (IsCodeKey(upload)) return BlobScope{KeyScope::Platform(), kCodeIdentity};
  if (IsUuid(upload)) {
    GRADHUB_ASSIGN_OR_RETURN(
        db::Result rows, pool_->Exec("SELECT c.blob_path, j.tenant_id FROM checkpoints c"
                                     " JOIN jobs j ON j.id = c.job_id WHERE c.upload_id = $1::uuid",
                                     {upload}));
    if (!rows.empty()) {
      return BlobScope{KeyScope::Tenant(rows.row(0).Get<int64_t>("tenant_id")),
                       rows.row(0).Get<std::string>("blob_path")};
    }
  }
  return absl::NotFoundError(absl::StrCat("upload '", upload, "' belongs to no checkpoint"));
}

absl::StatusOr<BlobScope> CheckpointBlobScopes::OfBlob(const std::string& blob) {
  if (IsCodeKey(blob)) return BlobScope{KeyScope::Platform(), kCodeIdentity};
  const std::string job_id = blob.substr(0, blob.find('/'));
  if (IsUuid(job_id)) {
    GRADHUB_ASSIGN_OR_RETURN(
        db::Result rows, pool_->Exec("SELECT tenant_id FROM jobs WHERE id = $1::uuid", {job_id}));
    if (!rows.empty()) {
      return BlobScope{KeyScope::Tenant(rows.row(0).Get<int64_t>("tenant_id")), blob};
    }
  }
  return absl::NotFoundError(absl::StrCat("blob '", blob, "' belongs to no job"));
}

}  // namespace gradhub::checkpoint
