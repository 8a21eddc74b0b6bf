// The series of pipeline-parallel jobs (JobSpec.parallelism, issue 33): what each rank reports
// of its stage's point-to-point traffic, idle share and activation memory.
//
//   gradhub_pipeline_bubble_fraction{job_id,rank,stage}         mean of the rank's last batch
//   gradhub_pipeline_p2p_bytes_total{job_id,rank,stage}         sent and received
//   gradhub_pipeline_p2p_wait_seconds_total{job_id,rank,stage}  blocked in sends and receives
//   gradhub_pipeline_peak_activation_bytes{job_id,rank,stage}   most of the rank's last batch
//
// Only ranks whose steps report a pipeline get them: a data-parallel job's steps leave every
// pipeline field zero, which means "absent" (StepTelemetry), so its ranks have none. The stage
// label adds no series of its own: a rank holds one stage (rank = replica * S + stage), and if
// it ever reports another, its series move to the new label instead of multiplying. So a job
// has at most 4 pipeline series per rank, within the bounds TrainingMetrics keeps on ranks.
//
// Thread-safety: PipelineFamilies may be used from any thread (prometheus-cpp families are
// thread-safe). PipelineSeries is plain state: TrainingMetrics guards it with its lock.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>

#include "gradhub/v1/telemetry.pb.h"

namespace gradhub::metrics {

// Whether `step` reports a pipeline stage: any pipeline field set (stage 0 reports traffic).
bool ReportsPipeline(const v1::StepTelemetry& step);

// One rank's pipeline series, under the label of its stage.
struct PipelineSeries {
  int32_t stage = 0;
  prometheus::Gauge* bubble_fraction = nullptr;
  prometheus::Counter* p2p_bytes = nullptr;
  prometheus::Counter* p2p_wait_seconds = nullptr;
  prometheus::Gauge* peak_activation_bytes = nullptr;
};

class PipelineFamilies {
 public:
  explicit PipelineFamilies(prometheus::Registry& registry);  // must outlive this

  // The steps of one batch of a rank, in order: creates the rank's series at its first step
  // that reports a pipeline (or moves them to a new stage), then adds that batch's traffic and
  // sets its gauges. Steps without pipeline fields change nothing.
  void Apply(const std::string& job_id, int32_t rank,
             const std::vector<const v1::StepTelemetry*>& steps,
             std::optional<PipelineSeries>& series);
  void Remove(const std::optional<PipelineSeries>& series);

 private:
  PipelineSeries Add(const std::string& job_id, int32_t rank, int32_t stage);

  prometheus::Family<prometheus::Gauge>* bubble_fraction_;
  prometheus::Family<prometheus::Counter>* p2p_bytes_;
  prometheus::Family<prometheus::Counter>* p2p_wait_seconds_;
  prometheus::Family<prometheus::Gauge>* peak_activation_bytes_;
};

}  // namespace gradhub::metrics
