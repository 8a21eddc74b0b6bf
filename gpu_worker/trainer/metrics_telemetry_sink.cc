#include "gpu_worker/trainer/metrics_telemetry_sink.h"

#include <google/protobuf/util/time_util.h>

namespace gradhub::trainer {

v1::StepTelemetry ToStepTelemetry(const StepReport& r) {
  v1::StepTelemetry step;
  step.set_step(r.step);
  step.set_epoch(static_cast<int32_t>(r.epoch));
  *step.mutable_time() = google::protobuf::util::TimeUtil::GetCurrentTime();
  step.set_loss(r.loss);
  step.set_learning_rate(r.learning_rate);
  step.set_samples(r.samples);
  step.set_samples_per_second(r.samples_per_second);
  step.set_forward_seconds(r.forward_seconds);
  step.set_backward_seconds(r.backward_seconds);
  step.set_allreduce_wait_seconds(r.allreduce_wait_seconds);
  step.set_optimizer_seconds(r.optimizer_seconds);
  step.set_step_seconds(r.step_seconds);
  step.set_allreduce_bytes(r.allreduce_bytes);
  step.set_allreduce_seconds(r.allreduce_seconds);
  step.set_bus_bandwidth_bytes_per_second(
      BusBandwidth(r.allreduce_bytes, r.allreduce_seconds, r.world_size));
  step.set_buckets(r.buckets);
  step.set_checkpoint_save_seconds(r.checkpoint_save_seconds);
  for (const auto& [name, value] : r.eval_metrics) (*step.mutable_eval_metrics())[name] = value;
  step.set_pipeline_stage(r.pipeline.stage);
  step.set_p2p_bytes(r.pipeline.p2p_bytes);
  step.set_p2p_wait_seconds(r.pipeline.p2p_wait_seconds);
  step.set_bubble_fraction(r.pipeline.bubble_fraction);
  step.set_peak_activation_bytes(r.pipeline.peak_activation_bytes);
  return step;
}

MetricsTelemetrySink::~MetricsTelemetrySink() {
  reporter_->Close(std::chrono::steady_clock::now() + std::chrono::seconds(1));
}

}  // namespace gradhub::trainer
