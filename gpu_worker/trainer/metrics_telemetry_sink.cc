#include "gpu_worker/trainer/metrics_telemetry_sink.h"

namespace gradhub::trainer {

telemetry_client::StepFigures ToStepFigures(const StepReport& r) {
  telemetry_client::StepFigures step;
  step.step = r.step;
  step.epoch = static_cast<int32_t>(r.epoch);
  step.time = std::chrono::system_clock::now();
  step.loss = r.loss;
  step.learning_rate = r.learning_rate;
  step.samples = r.samples;
  step.samples_per_second = r.samples_per_second;
  step.forward_seconds = r.forward_seconds;
  step.backward_seconds = r.backward_seconds;
  step.allreduce_wait_seconds = r.allreduce_wait_seconds;
  step.optimizer_seconds = r.optimizer_seconds;
  step.step_seconds = r.step_seconds;
  step.allreduce_bytes = r.allreduce_bytes;
  step.allreduce_seconds = r.allreduce_seconds;
  step.bus_bandwidth_bytes_per_second =
      BusBandwidth(r.allreduce_bytes, r.allreduce_seconds, r.world_size);
  step.buckets = r.buckets;
  step.checkpoint_save_seconds = r.checkpoint_save_seconds;
  step.eval_metrics = r.eval_metrics;  // empty (nothing allocated) but on evaluation steps
  step.pipeline_stage = r.pipeline.stage;
  step.p2p_bytes = r.pipeline.p2p_bytes;
  step.p2p_wait_seconds = r.pipeline.p2p_wait_seconds;
  step.bubble_fraction = r.pipeline.bubble_fraction;
  step.peak_activation_bytes = r.pipeline.peak_activation_bytes;
  return step;
}

MetricsTelemetrySink::~MetricsTelemetrySink() {
  reporter_->Close(std::chrono::steady_clock::now() + std::chrono::seconds(1));
}

}  // namespace gradhub::trainer
