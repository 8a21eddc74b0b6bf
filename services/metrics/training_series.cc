#include "services/metrics/training_series.h"

#include <cmath>

namespace gradhub::metrics {
namespace {

// An allreduce of one step: from a small model on loopback (100 us) to a stuck peer (10 s).
const prometheus::Histogram::BucketBoundaries kAllreduceBuckets = {
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
    0.05,   0.1,     0.25,   0.5,   1,      2.5,   5,    10};
// A checkpoint save: from a small model on local disk to a large one over the network.
const prometheus::Histogram::BucketBoundaries kCheckpointBuckets = {
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 60, 120, 300};

// A duration as a trainer measured it, or 0 when it is not one (NaN, negative).
double Seconds(double value) { return std::isfinite(value) && value > 0 ? value : 0; }

prometheus::Family<prometheus::Gauge>* Gauges(prometheus::Registry& registry, const char* name,
                                              const char* help) {
  return &prometheus::BuildGauge().Name(name).Help(help).Register(registry);
}

prometheus::Family<prometheus::Counter>* Counters(prometheus::Registry& registry, const char* name,
                                                  const char* help) {
  return &prometheus::BuildCounter().Name(name).Help(help).Register(registry);
}

prometheus::Family<prometheus::Histogram>* Histograms(prometheus::Registry& registry,
                                                      const char* name, const char* help) {
  return &prometheus::BuildHistogram().Name(name).Help(help).Register(registry);
}

}  // namespace

SeriesFamilies::SeriesFamilies(prometheus::Registry& registry, int max_eval_metrics_per_job)
    : max_eval_metrics_(max_eval_metrics_per_job),
      step_(Gauges(registry, "gradhub_training_step", "Last optimizer step a rank reported.")),
      loss_(Gauges(registry, "gradhub_training_loss",
                   "Training loss of the last step a rank reported.")),
      learning_rate_(
          Gauges(registry, "gradhub_learning_rate", "Learning rate of the last reported step.")),
      samples_per_second_(Gauges(registry, "gradhub_samples_per_second",
                                 "A rank's throughput at its last step; the job's is the sum.")),
      samples_(Counters(registry, "gradhub_samples_total", "Training samples a rank processed.")),
      allreduce_seconds_(Histograms(registry, "gradhub_allreduce_seconds",
                                    "Per step and rank: launch-to-completion time of the "
                                    "gradient allreduces, summed over buckets.")),
      allreduce_bytes_(Counters(registry, "gradhub_allreduce_bytes_total",
                                "Gradient bytes allreduced, summed over ranks.")),
      bus_bandwidth_(Gauges(registry, "gradhub_allreduce_bus_bandwidth_bytes_per_second",
                            "Allreduce bus bandwidth (nccl-tests' definition) of a rank, mean of "
                            "its last batch of steps.")),
      checkpoint_save_seconds_(Histograms(registry, "gradhub_checkpoint_save_seconds",
                                          "Time a trainer took to save a checkpoint.")),
      eval_metric_(
          Gauges(registry, "gradhub_eval_metric", "Last evaluation of a job, by metric name.")),
      pipeline_(registry) {}

JobSeries SeriesFamilies::AddJob(const std::string& job_id) {
  const prometheus::Labels labels = {{"job_id", job_id}};
  JobSeries job;
  job.learning_rate = &learning_rate_->Add(labels);
  // NaN until a rank reports one: a script may never (0 would claim a learning rate of 0).
  job.learning_rate->Set(std::nan(""));
  job.allreduce_seconds = &allreduce_seconds_->Add(labels, kAllreduceBuckets);
  job.allreduce_bytes = &allreduce_bytes_->Add(labels);
  job.checkpoint_save_seconds = &checkpoint_save_seconds_->Add(labels, kCheckpointBuckets);
  return job;
}

RankSeries SeriesFamilies::AddRank(const std::string& job_id, int32_t rank) {
  const prometheus::Labels labels = {{"job_id", job_id}, {"rank", std::to_string(rank)}};
  RankSeries series;
  series.step = &step_->Add(labels);
  series.loss = &loss_->Add(labels);
  series.samples_per_second = &samples_per_second_->Add(labels);
  series.samples = &samples_->Add(labels);
  series.bus_bandwidth = &bus_bandwidth_->Add(labels);
  return series;
}

void SeriesFamilies::Remove(const JobSeries& job, const std::vector<const RankSeries*>& ranks) {
  learning_rate_->Remove(job.learning_rate);
  allreduce_seconds_->Remove(job.allreduce_seconds);
  allreduce_bytes_->Remove(job.allreduce_bytes);
  checkpoint_save_seconds_->Remove(job.checkpoint_save_seconds);
  for (const auto& [name, gauge] : job.eval) eval_metric_->Remove(gauge);
  for (const RankSeries* series : ranks) {
    step_->Remove(series->step);
    loss_->Remove(series->loss);
    samples_per_second_->Remove(series->samples_per_second);
    samples_->Remove(series->samples);
    bus_bandwidth_->Remove(series->bus_bandwidth);
    pipeline_.Remove(series->pipeline);
  }
}

void SeriesFamilies::Apply(const std::string& job_id, int32_t rank_id,
                           const std::vector<const v1::StepTelemetry*>& steps, JobSeries& job,
                           RankSeries& rank) {
  double bandwidth_sum = 0;
  int bandwidth_steps = 0;
  for (const v1::StepTelemetry* step : steps) {
    ApplyStep(job_id, *step, job, rank);
    if (const double bandwidth = Seconds(step->bus_bandwidth_bytes_per_second()); bandwidth > 0) {
      bandwidth_sum += bandwidth;
      ++bandwidth_steps;
    }
  }
  if (bandwidth_steps > 0) rank.bus_bandwidth->Set(bandwidth_sum / bandwidth_steps);
  pipeline_.Apply(job_id, rank_id, steps, rank.pipeline);
}

void SeriesFamilies::ApplyStep(const std::string& job_id, const v1::StepTelemetry& step,
                               JobSeries& job, RankSeries& rank) {
  rank.step->Set(static_cast<double>(step.step()));
  rank.loss->Set(step.loss());
  rank.samples_per_second->Set(step.samples_per_second());
  if (step.samples() > 0) rank.samples->Increment(static_cast<double>(step.samples()));
  // NaN: this rank did not report it (a script rank that does not pass learning_rate); the
  // job's gauge keeps what another rank or an earlier step reported.
  if (!std::isnan(step.learning_rate())) job.learning_rate->Set(step.learning_rate());
  const std::array<double, kStepPhases.size()> phases = {
      step.forward_seconds(), step.backward_seconds(), step.allreduce_wait_seconds(),
      step.optimizer_seconds(), step.step_seconds()};
  for (size_t i = 0; i < phases.size(); ++i) rank.phase_sum[i] += Seconds(phases[i]);
  ++rank.phase_count;
  if (step.allreduce_bytes() > 0) {
    job.allreduce_bytes->Increment(static_cast<double>(step.allreduce_bytes()));
    job.allreduce_seconds->Observe(Seconds(step.allreduce_seconds()));
  }
  if (const double save = Seconds(step.checkpoint_save_seconds()); save > 0) {
    job.checkpoint_save_seconds->Observe(save);
  }
  if (!step.eval_metrics().empty()) SetEvalMetrics(job_id, step, job);
}

void SeriesFamilies::SetEvalMetrics(const std::string& job_id, const v1::StepTelemetry& step,
                                    JobSeries& job) {
  // In name order, so that which names a job past the limit keeps does not depend on the
  // order of a protobuf map.
  const std::map<std::string, double> metrics(step.eval_metrics().begin(),
                                              step.eval_metrics().end());
  for (const auto& [name, value] : metrics) {
    auto it = job.eval.find(name);
    if (it == job.eval.end()) {
      if (static_cast<int>(job.eval.size()) >= max_eval_metrics_) continue;
      it = job.eval.emplace(name, &eval_metric_->Add({{"job_id", job_id}, {"name", name}})).first;
    }
    it->second->Set(value);
  }
}

TelemetryCounters::TelemetryCounters(prometheus::Registry& registry)
    : accepted_steps_(
          &Counters(registry, "gradhub_telemetry_steps_total", "Steps of telemetry accepted.")
               ->Add({})),
      streams_(&Gauges(registry, "gradhub_telemetry_streams", "Open telemetry streams.")->Add({})) {
  auto* dropped = Counters(registry, "gradhub_telemetry_dropped_total",
                           "Steps of telemetry lost: dropped by trainers (trainer_queue_full) or "
                           "refused by this service.");
  for (int reason = 0; reason < kDropReasons; ++reason) {
    dropped_[reason] =
        &dropped->Add({{"reason", DropReasonLabel(static_cast<DropReason>(reason))}});
  }
}

void TelemetryCounters::Accept(int64_t steps) {
  accepted_steps_->Increment(static_cast<double>(steps));
}

void TelemetryCounters::Drop(DropReason reason, int64_t steps) {
  if (steps > 0) dropped_[static_cast<int>(reason)]->Increment(static_cast<double>(steps));
}

void TelemetryCounters::AddStreams(int delta) { streams_->Increment(delta); }

prometheus::MetricFamily StepPhaseFamily() {
  return {"gradhub_step_phase_seconds",
          "Time of each phase of a rank's steps: rate(_sum) / rate(_count) is the mean over a "
          "window. backward includes the allreduces it overlapped; allreduce_wait is what it did "
          "not hide; step is the whole step, data loading included.",
          prometheus::MetricType::Summary,
          {}};
}

void AppendStepPhases(const std::string& job_id, int32_t rank, const RankSeries& series,
                      prometheus::MetricFamily& family) {
  for (size_t i = 0; i < kStepPhases.size(); ++i) {
    prometheus::ClientMetric& metric = family.metric.emplace_back();
    metric.label = {{"job_id", job_id}, {"phase", kStepPhases[i]}, {"rank", std::to_string(rank)}};
    metric.summary.sample_count = series.phase_count;
    metric.summary.sample_sum = series.phase_sum[i];
  }
}

}  // namespace gradhub::metrics
