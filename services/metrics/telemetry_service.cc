#include "services/metrics/telemetry_service.h"

#include "absl/strings/str_cat.h"
#include "services/common/auth/call_authorization.h"
#include "services/common/grpc_status.h"

namespace gradhub::metrics {
absl::Status ValidateBatch(const v1::TelemetryBatch& batch) {
  if (JobIdOf(batch.job()).empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("job: '", batch.job(), "' is not jobs/<job id>"));
  }
  if (batch.attempt() < 1) return absl::InvalidArgumentError("attempt: must be at least 1");
  if (batch.rank() < 0) return absl::InvalidArgumentError("rank: must not be negative");
  return absl::OkStatus();
}

grpc::Status TelemetryService::ReportTelemetry(grpc::ServerContext* context,
                                               grpc::ServerReader<v1::TelemetryBatch>* reader,
                                               v1::ReportTelemetryResponse* response) {
  if (absl::Status allowed = authorize_(api::AuthorizationOf(*context)); !allowed.ok()) {
    return ToGrpc(allowed);
  }
  metrics_->AddStreams(1);
  int64_t accepted = 0;
  grpc::Status status = grpc::Status::OK;
  v1::TelemetryBatch batch;
  while (reader->Read(&batch)) {
    if (absl::Status valid = ValidateBatch(batch); !valid.ok()) {
      metrics_->CountDropped(DropReason::kInvalid, batch.steps_size());
      status = ToGrpc(valid);
      break;
    }
    accepted += metrics_->Record(batch).accepted;
  }
  metrics_->AddStreams(-1);
  if (!status.ok()) return status;
  if (context->IsCancelled()) return grpc::Status(grpc::StatusCode::CANCELLED, "stream cancelled");
  response->set_accepted_steps(accepted);
  return grpc::Status::OK;
}

}  // namespace gradhub::metrics
