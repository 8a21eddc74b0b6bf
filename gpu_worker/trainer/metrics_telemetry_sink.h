// The trainer's TelemetrySink over gradhub-metrics: each step's figures are copied into a
// TelemetryReporter's queue, which builds the messages and sends them in batches off the
// training thread. gRPC and protobuf only (no torch), compiled into the gradhub-trainer binary.
#pragma once

#include <memory>

#include "gpu_worker/telemetry_client/telemetry_reporter.h"
#include "gpu_worker/trainer/sinks.h"

namespace gradhub::trainer {

// The step as telemetry.proto has it, stamped with the time now (the step just finished).
telemetry_client::StepFigures ToStepFigures(const StepReport& report);

class MetricsTelemetrySink : public TelemetrySink {
 public:
  explicit MetricsTelemetrySink(telemetry_client::TelemetryReporterOptions options)
      : reporter_(std::make_unique<telemetry_client::TelemetryReporter>(std::move(options))) {}
  // Sends what is queued for at most a second: telemetry never holds up the exit.
  ~MetricsTelemetrySink() override;

  void Report(const StepReport& report) override { reporter_->Report(ToStepFigures(report)); }

 private:
  std::unique_ptr<telemetry_client::TelemetryReporter> reporter_;
};

}  // namespace gradhub::trainer
