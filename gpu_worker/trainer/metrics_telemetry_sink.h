// The trainer's TelemetrySink over gradhub-metrics: each step becomes a v1::StepTelemetry
// queued on a TelemetryReporter, which batches and sends it off the training thread. gRPC and
// protobuf only (no torch), compiled into the gradhub-trainer binary.
#pragma once

#include <memory>

#include "gpu_worker/telemetry_client/telemetry_reporter.h"
#include "gpu_worker/trainer/sinks.h"

namespace gradhub::trainer {

// As nccl-tests define it: the algorithm bandwidth times 2 (n - 1) / n, comparable with the
// link's bandwidth whatever the world size. 0 without time or without peers.
double BusBandwidth(int64_t bytes, double seconds, int world_size);

v1::StepTelemetry ToStepTelemetry(const StepReport& report);

class MetricsTelemetrySink : public TelemetrySink {
 public:
  explicit MetricsTelemetrySink(telemetry_client::TelemetryReporterOptions options)
      : reporter_(std::make_unique<telemetry_client::TelemetryReporter>(std::move(options))) {}
  // Sends what is queued for at most a second: telemetry never holds up the exit.
  ~MetricsTelemetrySink() override;

  void Report(const StepReport& report) override { reporter_->Report(ToStepTelemetry(report)); }

 private:
  std::unique_ptr<telemetry_client::TelemetryReporter> reporter_;
};

}  // namespace gradhub::trainer
