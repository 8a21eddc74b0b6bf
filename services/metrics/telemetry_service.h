// gradhub.v1.TelemetryService on gRPC's synchronous API: the adapter between trainers' streams
// and TrainingMetrics. A stream holds one server thread for its life (one per rank); that is
// the price of the sync API, which the service's server keeps for the reason given in
// services/common/async_grpc_service.h.
//
// A stream, in order (the rules are telemetry_intake.h's, which POST /v1/telemetry shares):
//   1. The caller's token must be a job token (a rank's) or the admin token
//      (UNAUTHENTICATED / PERMISSION_DENIED before anything is read).
//   2. A job token is authorized again before a batch once kSenderRecheck (5 s) has passed
//      since the last time: a token whose attempt ended (or whose job did) ends the stream
//      UNAUTHENTICATED.
//   3. Each batch must be well formed and, for a job token, of its own job, attempt and rank;
//      one that is not ends the stream with INVALID_ARGUMENT / PERMISSION_DENIED naming the
//      field.
//   4. Each batch goes to TrainingMetrics, which keeps or drops its steps (and counts them);
//      dropping never ends the stream, so a trainer of a refused job is not told to reconnect.
//   5. When the client half-closes, the answer counts the steps accepted over the stream.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "gradhub/v1/telemetry.grpc.pb.h"
#include "services/metrics/telemetry_intake.h"
#include "services/metrics/training_metrics.h"

namespace gradhub::metrics {

class TelemetryService final : public v1::TelemetryService::Service {
 public:
  // `metrics` is not owned and must outlive the service.
  TelemetryService(TrainingMetrics* metrics, AuthorizeTelemetry authorize)
      : metrics_(metrics), authorize_(std::move(authorize)) {}

  grpc::Status ReportTelemetry(grpc::ServerContext* context,
                               grpc::ServerReader<v1::TelemetryBatch>* reader,
                               v1::ReportTelemetryResponse* response) override;

 private:
  TrainingMetrics* metrics_;
  AuthorizeTelemetry authorize_;
};

}  // namespace gradhub::metrics
