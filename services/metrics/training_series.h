// The Prometheus side of TrainingMetrics (training_metrics.h lists the series): the families,
// the series of one job and of one rank, and the service's own counters.
//
// Thread-safety: SeriesFamilies and TelemetryCounters may be used from any thread (prometheus-cpp
// families and metrics are thread-safe). JobSeries and RankSeries are plain state: TrainingMetrics
// guards them with its lock.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/metric_family.h>
#include <prometheus/registry.h>

#include "gradhub/v1/telemetry.pb.h"
#include "services/metrics/pipeline_series.h"
#include "services/metrics/telemetry_rules.h"

namespace gradhub::metrics {

// The `phase` label of gradhub_step_phase_seconds, in StepPhases' order.
inline constexpr std::array<const char*, 5> kStepPhases = {"forward", "backward", "allreduce_wait",
                                                           "optimizer", "step"};

struct RankSeries {
  prometheus::Gauge* step = nullptr;
  prometheus::Gauge* loss = nullptr;
  prometheus::Gauge* samples_per_second = nullptr;
  prometheus::Counter* samples = nullptr;
  prometheus::Gauge* bus_bandwidth = nullptr;
  // gradhub_step_phase_seconds: every step observes every phase, so one count serves all.
  std::array<double, kStepPhases.size()> phase_sum{};
  uint64_t phase_count = 0;
  // Only for ranks of a pipeline stage (pipeline_series.h).
  std::optional<PipelineSeries> pipeline;
};

struct JobSeries {
  prometheus::Gauge* learning_rate = nullptr;
  prometheus::Histogram* allreduce_seconds = nullptr;
  prometheus::Counter* allreduce_bytes = nullptr;
  prometheus::Histogram* checkpoint_save_seconds = nullptr;
  std::map<std::string, prometheus::Gauge*> eval;  // by metric name
};

// The families of the jobs' and ranks' series, registered in `registry`.
class SeriesFamilies {
 public:
  // `registry` must outlive this. A job keeps `max_eval_metrics_per_job` evaluation names.
  SeriesFamilies(prometheus::Registry& registry, int max_eval_metrics_per_job);

  JobSeries AddJob(const std::string& job_id);
  RankSeries AddRank(const std::string& job_id, int32_t rank);
  // Removes the job's series and those of its ranks.
  void Remove(const JobSeries& job, const std::vector<const RankSeries*>& ranks);
  // The steps of one batch of rank `rank_id` that the rules accepted, in order: each sets the
  // series; the rank's bus bandwidth is the mean of those steps that measured one.
  void Apply(const std::string& job_id, int32_t rank_id,
             const std::vector<const v1::StepTelemetry*>& steps, JobSeries& job, RankSeries& rank);

 private:
  void ApplyStep(const std::string& job_id, const v1::StepTelemetry& step, JobSeries& job,
                 RankSeries& rank);
  void SetEvalMetrics(const std::string& job_id, const v1::StepTelemetry& step, JobSeries& job);

  const int max_eval_metrics_;
  prometheus::Family<prometheus::Gauge>* step_;
  prometheus::Family<prometheus::Gauge>* loss_;
  prometheus::Family<prometheus::Gauge>* learning_rate_;
  prometheus::Family<prometheus::Gauge>* samples_per_second_;
  prometheus::Family<prometheus::Counter>* samples_;
  prometheus::Family<prometheus::Histogram>* allreduce_seconds_;
  prometheus::Family<prometheus::Counter>* allreduce_bytes_;
  prometheus::Family<prometheus::Gauge>* bus_bandwidth_;
  prometheus::Family<prometheus::Histogram>* checkpoint_save_seconds_;
  prometheus::Family<prometheus::Gauge>* eval_metric_;
  PipelineFamilies pipeline_;
};

// gradhub_telemetry_steps_total, gradhub_telemetry_dropped_total and gradhub_telemetry_streams.
class TelemetryCounters {
 public:
  explicit TelemetryCounters(prometheus::Registry& registry);  // must outlive this
  void Accept(int64_t steps);
  void Drop(DropReason reason, int64_t steps);  // nothing for steps <= 0
  void AddStreams(int delta);

 private:
  prometheus::Counter* accepted_steps_;
  prometheus::Gauge* streams_;
  std::array<prometheus::Counter*, kDropReasons> dropped_{};
};

// The family gradhub_step_phase_seconds (a summary, count and sum only), and a rank's samples
// of it. Not in the registry: the sums are plain state read under TrainingMetrics' lock.
prometheus::MetricFamily StepPhaseFamily();
void AppendStepPhases(const std::string& job_id, int32_t rank, const RankSeries& series,
                      prometheus::MetricFamily& family);

}  // namespace gradhub::metrics
