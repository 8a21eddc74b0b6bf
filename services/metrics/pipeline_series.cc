#include "services/metrics/pipeline_series.h"

#include <algorithm>
#include <cmath>

namespace gradhub::metrics {
namespace {

// What one batch of a rank adds to its series: the sums of its steps since the last change of
// stage (a gauge shows the batch's steps of the stage it ends on).
struct BatchSums {
  double bubble_sum = 0;
  int bubble_steps = 0;
  int64_t peak_activation_bytes = 0;
};

bool IsFraction(double value) { return std::isfinite(value) && value > 0 && value <= 1; }

double Seconds(double value) { return std::isfinite(value) && value > 0 ? value : 0; }

void AddStep(const v1::StepTelemetry& step, PipelineSeries& series, BatchSums& sums) {
  if (step.p2p_bytes() > 0) series.p2p_bytes->Increment(static_cast<double>(step.p2p_bytes()));
  if (const double wait = Seconds(step.p2p_wait_seconds()); wait > 0) {
    series.p2p_wait_seconds->Increment(wait);
  }
  if (IsFraction(step.bubble_fraction())) {
    sums.bubble_sum += step.bubble_fraction();
    ++sums.bubble_steps;
  }
  sums.peak_activation_bytes = std::max(sums.peak_activation_bytes, step.peak_activation_bytes());
}

}  // namespace

bool ReportsPipeline(const v1::StepTelemetry& step) {
  return step.pipeline_stage() != 0 || step.p2p_bytes() != 0 || step.p2p_wait_seconds() != 0 ||
         step.bubble_fraction() != 0 || step.peak_activation_bytes() != 0;
}

PipelineFamilies::PipelineFamilies(prometheus::Registry& registry)
    : bubble_fraction_(&prometheus::BuildGauge()
                            .Name("gradhub_pipeline_bubble_fraction")
                            .Help("Share of a pipeline stage's step spent idle, waiting for its "
                                  "neighbours; mean of the rank's last batch of steps. Ideal on "
                                  "balanced stages: (S - 1) / (M + S - 1).")
                            .Register(registry)),
      p2p_bytes_(&prometheus::BuildCounter()
                      .Name("gradhub_pipeline_p2p_bytes_total")
                      .Help("Activation and gradient bytes a pipeline stage's rank sent to and "
                            "received from its neighbouring stages.")
                      .Register(registry)),
      p2p_wait_seconds_(&prometheus::BuildCounter()
                             .Name("gradhub_pipeline_p2p_wait_seconds_total")
                             .Help("Time a pipeline stage's rank waited for point-to-point "
                                   "messages (receives, and the end of its sends).")
                             .Register(registry)),
      peak_activation_bytes_(&prometheus::BuildGauge()
                                  .Name("gradhub_pipeline_peak_activation_bytes")
                                  .Help("Most activation bytes a pipeline stage held for "
                                        "backward at once, over the rank's last batch of steps.")
                                  .Register(registry)) {}

PipelineSeries PipelineFamilies::Add(const std::string& job_id, int32_t rank, int32_t stage) {
  const prometheus::Labels labels = {
      {"job_id", job_id}, {"rank", std::to_string(rank)}, {"stage", std::to_string(stage)}};
  PipelineSeries series;
  series.stage = stage;
  series.bubble_fraction = &bubble_fraction_->Add(labels);
  series.p2p_bytes = &p2p_bytes_->Add(labels);
  series.p2p_wait_seconds = &p2p_wait_seconds_->Add(labels);
  series.peak_activation_bytes = &peak_activation_bytes_->Add(labels);
  // NaN until measured: 0 would claim a stage that never idles or holds nothing.
  series.bubble_fraction->Set(std::nan(""));
  series.peak_activation_bytes->Set(std::nan(""));
  return series;
}

void PipelineFamilies::Apply(const std::string& job_id, int32_t rank,
                             const std::vector<const v1::StepTelemetry*>& steps,
                             std::optional<PipelineSeries>& series) {
  BatchSums sums;
  for (const v1::StepTelemetry* step : steps) {
    if (!ReportsPipeline(*step)) continue;
    if (!series || series->stage != step->pipeline_stage()) {
      Remove(series);
      series = Add(job_id, rank, step->pipeline_stage());
      sums = {};
    }
    AddStep(*step, *series, sums);
  }
  if (!series) return;
  if (sums.bubble_steps > 0) series->bubble_fraction->Set(sums.bubble_sum / sums.bubble_steps);
  if (sums.peak_activation_bytes > 0) {
    series->peak_activation_bytes->Set(static_cast<double>(sums.peak_activation_bytes));
  }
}

void PipelineFamilies::Remove(const std::optional<PipelineSeries>& series) {
  if (!series) return;
  bubble_fraction_->Remove(series->bubble_fraction);
  p2p_bytes_->Remove(series->p2p_bytes);
  p2p_wait_seconds_->Remove(series->p2p_wait_seconds);
  peak_activation_bytes_->Remove(series->peak_activation_bytes);
}

}  // namespace gradhub::metrics
