#include "services/metrics/telemetry_service.h"

#include "services/common/auth/call_authorization.h"
#include "services/common/grpc_status.h"

namespace gradhub::metrics {

grpc::Status TelemetryService::ReportTelemetry(grpc::ServerContext* context,
                                               grpc::ServerReader<v1::TelemetryBatch>* reader,
                                               v1::ReportTelemetryResponse* response) {
  const std::string authorization = api::AuthorizationOf(*context);
  absl::StatusOr<TelemetrySender> sender = authorize_(authorization);
  if (!sender.ok()) return ToGrpc(sender.status());
  absl::Time checked = absl::Now();
  metrics_->AddStreams(1);
  int64_t accepted = 0;
  grpc::Status status = grpc::Status::OK;
  v1::TelemetryBatch batch;
  while (reader->Read(&batch)) {
    if (MustRecheckSender(*sender, checked, absl::Now())) {  // step 2
      checked = absl::Now();
      sender = authorize_(authorization);
      if (!sender.ok()) {
        status = ToGrpc(sender.status());
        break;
      }
    }
    const absl::StatusOr<BatchOutcome> outcome = IngestBatch(*metrics_, *sender, batch);
    if (!outcome.ok()) {
      status = ToGrpc(outcome.status());
      break;
    }
    accepted += outcome->accepted;
  }
  metrics_->AddStreams(-1);
  if (!status.ok()) return status;
  if (context->IsCancelled()) return grpc::Status(grpc::StatusCode::CANCELLED, "stream cancelled");
  response->set_accepted_steps(accepted);
  return grpc::Status::OK;
}

}  // namespace gradhub::metrics
