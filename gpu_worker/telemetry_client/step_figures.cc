#include "gpu_worker/telemetry_client/step_figures.h"

#include <google/protobuf/util/time_util.h>

namespace gradhub::telemetry_client {

void FillStepTelemetry(const StepFigures& f, v1::StepTelemetry* step) {
  step->set_step(f.step);
  step->set_epoch(f.epoch);
  if (f.time != std::chrono::system_clock::time_point{}) {
    const auto nanos =
        std::chrono::duration_cast<std::chrono::nanoseconds>(f.time.time_since_epoch()).count();
    *step->mutable_time() = google::protobuf::util::TimeUtil::NanosecondsToTimestamp(nanos);
  }
  step->set_loss(f.loss);
  step->set_learning_rate(f.learning_rate);
  step->set_samples(f.samples);
  step->set_samples_per_second(f.samples_per_second);
  step->set_forward_seconds(f.forward_seconds);
  step->set_backward_seconds(f.backward_seconds);
  step->set_allreduce_wait_seconds(f.allreduce_wait_seconds);
  step->set_optimizer_seconds(f.optimizer_seconds);
  step->set_step_seconds(f.step_seconds);
  step->set_allreduce_bytes(f.allreduce_bytes);
  step->set_allreduce_seconds(f.allreduce_seconds);
  step->set_bus_bandwidth_bytes_per_second(f.bus_bandwidth_bytes_per_second);
  step->set_buckets(f.buckets);
  for (const auto& [name, value] : f.eval_metrics) (*step->mutable_eval_metrics())[name] = value;
  step->set_checkpoint_save_seconds(f.checkpoint_save_seconds);
  step->set_pipeline_stage(f.pipeline_stage);
  step->set_p2p_bytes(f.p2p_bytes);
  step->set_p2p_wait_seconds(f.p2p_wait_seconds);
  step->set_bubble_fraction(f.bubble_fraction);
  step->set_peak_activation_bytes(f.peak_activation_bytes);
}

}  // namespace gradhub::telemetry_client
