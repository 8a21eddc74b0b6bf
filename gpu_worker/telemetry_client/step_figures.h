// One step of one rank as the TelemetryReporter queues it: telemetry.proto's StepTelemetry as
// plain values. The training thread copies one into the reporter's ring (no allocation, no
// protobuf); the sender thread turns a batch of them into messages (FillStepTelemetry).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>

#include "gradhub/v1/telemetry.pb.h"

namespace gradhub::telemetry_client {

// The fields of v1::StepTelemetry, same names, same meanings (see telemetry.proto).
struct StepFigures {
  int64_t step = 0;
  int32_t epoch = 0;
  // When the step finished; the epoch (the default) leaves StepTelemetry.time unset.
  std::chrono::system_clock::time_point time{};
  double loss = 0;
  double learning_rate = 0;
  int64_t samples = 0;
  double samples_per_second = 0;
  double forward_seconds = 0;
  double backward_seconds = 0;
  double allreduce_wait_seconds = 0;
  double optimizer_seconds = 0;
  double step_seconds = 0;
  int64_t allreduce_bytes = 0;
  double allreduce_seconds = 0;
  double bus_bandwidth_bytes_per_second = 0;
  int32_t buckets = 0;
  // Empty but on evaluation steps, so copying it costs nothing on the others.
  std::map<std::string, double> eval_metrics;
  double checkpoint_save_seconds = 0;
  int32_t pipeline_stage = 0;
  int64_t p2p_bytes = 0;
  double p2p_wait_seconds = 0;
  double bubble_fraction = 0;
  int64_t peak_activation_bytes = 0;
};

// Sets every field of `step` (a cleared message, or a new one) from `figures`.
void FillStepTelemetry(const StepFigures& figures, v1::StepTelemetry* step);

}  // namespace gradhub::telemetry_client
