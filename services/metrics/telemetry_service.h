// gradhub.v1.TelemetryService on gRPC's synchronous API: the adapter between trainers' streams
// and TrainingMetrics. A stream holds one server thread for its life (one per rank); that is
// the price of the sync API, which the service's server keeps for the reason given in
// services/common/async_grpc_service.h.
//
// A stream, in order:
//   1. The caller's token must be a node token or the admin token (UNAUTHENTICATED /
//      PERMISSION_DENIED before anything is read).
//   2. Each batch must name a job as jobs/<uuid>, attempt >= 1 and rank >= 0; a malformed
//      one ends the stream with INVALID_ARGUMENT naming the field.
//   3. Each batch goes to TrainingMetrics, which keeps or drops its steps (and counts them);
//      dropping never ends the stream, so a trainer of a refused job is not told to reconnect.
//   4. When the client half-closes, the answer counts the steps accepted over the stream.
#pragma once

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "gradhub/v1/telemetry.grpc.pb.h"
#include "services/metrics/training_metrics.h"

namespace gradhub::metrics {

class TelemetryService final : public v1::TelemetryService::Service {
 public:
  // OK when the `authorization` header value may report telemetry.
  using Authorize = std::function<absl::Status(const std::string& authorization)>;

  // `metrics` is not owned and must outlive the service.
  TelemetryService(TrainingMetrics* metrics, Authorize authorize)
      : metrics_(metrics), authorize_(std::move(authorize)) {}

  grpc::Status ReportTelemetry(grpc::ServerContext* context,
                               grpc::ServerReader<v1::TelemetryBatch>* reader,
                               v1::ReportTelemetryResponse* response) override;

 private:
  TrainingMetrics* metrics_;
  Authorize authorize_;
};

// INVALID_ARGUMENT naming the first malformed field of `batch`, else OK.
absl::Status ValidateBatch(const v1::TelemetryBatch& batch);

}  // namespace gradhub::metrics
