#include "services/metrics/training_metrics.h"

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <vector>

namespace gradhub::metrics {
namespace {

// An allreduce of one step: from a small model on loopback (100 us) to a stuck peer (10 s).
const prometheus::Histogram::BucketBoundaries kAllreduceBuckets = {
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
    0.05,   0.1,     0.25,   0.5,   1,      2.5,   5,    10};
// A checkpoint save: from a small model on local disk to a large one over the network.
const prometheus::Histogram::BucketBoundaries kCheckpointBuckets = {
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 60, 120, 300};

constexpr std::array<const char*, 5> kPhases = {"forward", "backward", "allreduce_wait",
                                                "optimizer", "step"};

// A duration as a trainer measured it, or 0 when it is not one (NaN, negative).
double Seconds(double value) { return std::isfinite(value) && value > 0 ? value : 0; }

// The set of refused job ids is pruned at every sweep; this bounds it between sweeps against a
// flood of made-up ids.
constexpr size_t kMaxRefusals = 10000;

}  // namespace

const char* DropReasonLabel(DropReason reason) {
  switch (reason) {
    case DropReason::kTrainerQueueFull:
      return "trainer_queue_full";
    case DropReason::kDuplicateStep:
      return "duplicate_step";
    case DropReason::kStaleAttempt:
      return "stale_attempt";
    case DropReason::kUnknownJob:
      return "unknown_job";
    case DropReason::kFinishedJob:
      return "finished_job";
    case DropReason::kJobLimit:
      return "job_limit";
    case DropReason::kInvalid:
      return "invalid";
    case DropReason::kUnavailable:
      return "unavailable";
  }
  return "invalid";
}

struct TrainingMetrics::RankSeries {
  int32_t attempt = 0;
  int64_t last_step = -1;
  int64_t trainer_dropped = 0;  // the reporter's cumulative count last seen
  prometheus::Gauge* step = nullptr;
  prometheus::Gauge* loss = nullptr;
  prometheus::Gauge* samples_per_second = nullptr;
  prometheus::Counter* samples = nullptr;
  prometheus::Gauge* bus_bandwidth = nullptr;
  // gradhub_step_phase_seconds: every step observes every phase, so one count serves all.
  std::array<double, kPhases.size()> phase_sum{};
  uint64_t phase_count = 0;
};

struct TrainingMetrics::JobSeries {
  int32_t current_attempt = 0;
  int32_t world_size = 0;
  bool terminal = false;
  absl::Time ended = absl::InfiniteFuture();
  absl::Time last_report;
  prometheus::Gauge* learning_rate = nullptr;
  prometheus::Histogram* allreduce_seconds = nullptr;
  prometheus::Counter* allreduce_bytes = nullptr;
  prometheus::Histogram* checkpoint_save_seconds = nullptr;
  std::map<std::string, prometheus::Gauge*> eval;
  std::map<int32_t, RankSeries> ranks;
};

TrainingMetrics::TrainingMetrics(JobDirectory* directory, TrainingMetricsOptions options)
    : directory_(directory),
      options_(options),
      registry_(std::make_shared<prometheus::Registry>()) {
  auto gauge = [this](const char* name, const char* help) {
    return &prometheus::BuildGauge().Name(name).Help(help).Register(*registry_);
  };
  auto counter = [this](const char* name, const char* help) {
    return &prometheus::BuildCounter().Name(name).Help(help).Register(*registry_);
  };
  auto histogram = [this](const char* name, const char* help) {
    return &prometheus::BuildHistogram().Name(name).Help(help).Register(*registry_);
  };
  step_ = gauge("gradhub_training_step", "Last optimizer step a rank reported.");
  loss_ = gauge("gradhub_training_loss", "Training loss of the last step a rank reported.");
  learning_rate_ = gauge("gradhub_learning_rate", "Learning rate of the last reported step.");
  samples_per_second_ = gauge("gradhub_samples_per_second",
                              "A rank's throughput at its last step; the job's is the sum.");
  samples_ = counter("gradhub_samples_total", "Training samples a rank processed.");
  allreduce_seconds_ = histogram("gradhub_allreduce_seconds",
                                 "Per step and rank: launch-to-completion time of the gradient "
                                 "allreduces, summed over buckets.");
  allreduce_bytes_ =
      counter("gradhub_allreduce_bytes_total", "Gradient bytes allreduced, summed over ranks.");
  bus_bandwidth_ = gauge("gradhub_allreduce_bus_bandwidth_bytes_per_second",
                         "Allreduce bus bandwidth (nccl-tests' definition) of a rank, mean of "
                         "its last batch of steps.");
  checkpoint_save_seconds_ =
      histogram("gradhub_checkpoint_save_seconds", "Time a trainer took to save a checkpoint.");
  eval_metric_ = gauge("gradhub_eval_metric", "Last evaluation of a job, by metric name.");
  accepted_steps_ =
      &counter("gradhub_telemetry_steps_total", "Steps of telemetry accepted.")->Add({});
  streams_ = &gauge("gradhub_telemetry_streams", "Open telemetry streams.")->Add({});
  auto* dropped = counter("gradhub_telemetry_dropped_total",
                          "Steps of telemetry lost: dropped by trainers (trainer_queue_full) or "
                          "refused by this service.");
  for (int reason = 0; reason < kDropReasons; ++reason) {
    dropped_[reason] =
        &dropped->Add({{"reason", DropReasonLabel(static_cast<DropReason>(reason))}});
  }
}

TrainingMetrics::~TrainingMetrics() = default;

void TrainingMetrics::Drop(DropReason reason, int64_t steps) {
  if (steps > 0) dropped_[static_cast<int>(reason)]->Increment(static_cast<double>(steps));
}

void TrainingMetrics::CountDropped(DropReason reason, int64_t steps) { Drop(reason, steps); }

void TrainingMetrics::AddStreams(int delta) { streams_->Increment(delta); }

int TrainingMetrics::live_jobs() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(jobs_.size());
}

void TrainingMetrics::Refuse(const std::string& id, DropReason reason, absl::Time now) {
  if (refused_.size() >= kMaxRefusals) refused_.clear();
  refused_[id] = {reason, now + options_.refusal_ttl};
}

BatchOutcome TrainingMetrics::Record(const v1::TelemetryBatch& batch, absl::Time now) {
  const std::string id = JobIdOf(batch.job());
  const int64_t steps = batch.steps_size();
  std::unique_lock<std::mutex> lock(mu_);
  DropReason refused = DropReason::kInvalid;
  JobSeries* job = Admit(id, batch.attempt(), now, lock, &refused);
  if (job == nullptr || batch.rank() >= job->world_size) {
    Drop(job == nullptr ? refused : DropReason::kInvalid, steps);
    return {0, steps};
  }
  job->last_report = now;
  RankSeries& rank = Rank(id, *job, batch.rank());
  if (rank.attempt != batch.attempt()) {  // a new attempt starts over (from its checkpoint)
    rank.attempt = batch.attempt();
    rank.last_step = -1;
    rank.trainer_dropped = 0;
  }
  // The reporter's count is cumulative, so a lost or resent batch neither loses nor doubles it.
  const int64_t trainer_dropped = batch.dropped_steps();
  if (trainer_dropped > rank.trainer_dropped) {
    Drop(DropReason::kTrainerQueueFull, trainer_dropped - rank.trainer_dropped);
    rank.trainer_dropped = trainer_dropped;
  }
  BatchOutcome outcome;
  double bandwidth_sum = 0;
  int bandwidth_steps = 0;
  for (const v1::StepTelemetry& step : batch.steps()) {
    if (step.step() <= rank.last_step) {
      ++outcome.dropped;
      continue;
    }
    rank.last_step = step.step();
    Apply(id, *job, rank, step);
    ++outcome.accepted;
    if (const double bandwidth = Seconds(step.bus_bandwidth_bytes_per_second()); bandwidth > 0) {
      bandwidth_sum += bandwidth;
      ++bandwidth_steps;
    }
  }
  if (bandwidth_steps > 0) rank.bus_bandwidth->Set(bandwidth_sum / bandwidth_steps);
  Drop(DropReason::kDuplicateStep, outcome.dropped);
  accepted_steps_->Increment(static_cast<double>(outcome.accepted));
  return outcome;
}

TrainingMetrics::JobSeries* TrainingMetrics::Admit(const std::string& id, int32_t attempt,
                                                   absl::Time now,
                                                   std::unique_lock<std::mutex>& lock,
                                                   DropReason* refused) {
  JobSeries* series = nullptr;
  if (AdmitLocked(id, attempt, now, nullptr, &series, refused) != Admission::kRetry) return series;
  // Not known, or a newer attempt than known: ask the directory, without the lock.
  lock.unlock();
  absl::StatusOr<std::map<std::string, JobStatus>> found = directory_->Lookup({id});
  lock.lock();
  if (!found.ok()) {
    *refused = DropReason::kUnavailable;
    return nullptr;
  }
  auto it = found->find(id);
  if (it == found->end()) {
    Refuse(id, DropReason::kUnknownJob, now);
    *refused = DropReason::kUnknownJob;
    return nullptr;
  }
  AdmitLocked(id, attempt, now, &it->second, &series, refused);
  return series;
}

// Rules 1-3 with what is known: `status` is the directory's answer, or nullptr when it was not
// asked (then kRetry means: ask it).
TrainingMetrics::Admission TrainingMetrics::AdmitLocked(const std::string& id, int32_t attempt,
                                                        absl::Time now, const JobStatus* status,
                                                        JobSeries** series, DropReason* refused) {
  auto refusal = refused_.find(id);
  if (refusal != refused_.end() && refusal->second.until > now) {
    *refused = refusal->second.reason;
    return Admission::kRefused;
  }
  auto it = jobs_.find(id);
  if (it == jobs_.end()) {
    if (status == nullptr) return Admission::kRetry;
    const DropReason reason = status->terminal ? DropReason::kFinishedJob : DropReason::kJobLimit;
    if (status->terminal || static_cast<int>(jobs_.size()) >= options_.max_jobs) {
      Refuse(id, reason, now);
      *refused = reason;
      return Admission::kRefused;
    }
    auto job = std::make_unique<JobSeries>();
    job->last_report = now;
    job->learning_rate = &learning_rate_->Add({{"job_id", id}});
    job->allreduce_seconds = &allreduce_seconds_->Add({{"job_id", id}}, kAllreduceBuckets);
    job->allreduce_bytes = &allreduce_bytes_->Add({{"job_id", id}});
    job->checkpoint_save_seconds =
        &checkpoint_save_seconds_->Add({{"job_id", id}}, kCheckpointBuckets);
    it = jobs_.emplace(id, std::move(job)).first;
  }
  JobSeries& job = *it->second;
  if (status != nullptr) {
    job.current_attempt = std::max(job.current_attempt, status->current_attempt);
    job.world_size = status->world_size;
  }
  if (attempt > job.current_attempt && status == nullptr) return Admission::kRetry;
  if (attempt != job.current_attempt) {
    *refused = DropReason::kStaleAttempt;
    return Admission::kRefused;
  }
  *series = &job;
  return Admission::kAdmitted;
}

TrainingMetrics::RankSeries& TrainingMetrics::Rank(const std::string& id, JobSeries& job,
                                                   int32_t rank) {
  auto [it, inserted] = job.ranks.try_emplace(rank);
  RankSeries& series = it->second;
  if (inserted) {
    const prometheus::Labels labels = {{"job_id", id}, {"rank", std::to_string(rank)}};
    series.step = &step_->Add(labels);
    series.loss = &loss_->Add(labels);
    series.samples_per_second = &samples_per_second_->Add(labels);
    series.samples = &samples_->Add(labels);
    series.bus_bandwidth = &bus_bandwidth_->Add(labels);
  }
  return series;
}

void TrainingMetrics::Apply(const std::string& id, JobSeries& job, RankSeries& rank,
                            const v1::StepTelemetry& step) {
  rank.step->Set(static_cast<double>(step.step()));
  rank.loss->Set(step.loss());
  rank.samples_per_second->Set(step.samples_per_second());
  if (step.samples() > 0) rank.samples->Increment(static_cast<double>(step.samples()));
  job.learning_rate->Set(step.learning_rate());
  const std::array<double, kPhases.size()> phases = {
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
  if (!step.eval_metrics().empty()) SetEvalMetrics(id, job, step);
}

void TrainingMetrics::SetEvalMetrics(const std::string& id, JobSeries& job,
                                     const v1::StepTelemetry& step) {
  // In name order, so that which names a job past the limit keeps does not depend on the
  // order of a protobuf map.
  const std::map<std::string, double> metrics(step.eval_metrics().begin(),
                                              step.eval_metrics().end());
  for (const auto& [name, value] : metrics) {
    auto it = job.eval.find(name);
    if (it == job.eval.end()) {
      if (static_cast<int>(job.eval.size()) >= options_.max_eval_metrics_per_job) continue;
      it = job.eval.emplace(name, &eval_metric_->Add({{"job_id", id}, {"name", name}})).first;
    }
    it->second->Set(value);
  }
}

void TrainingMetrics::RemoveSeries(JobSeries& job) {
  learning_rate_->Remove(job.learning_rate);
  allreduce_seconds_->Remove(job.allreduce_seconds);
  allreduce_bytes_->Remove(job.allreduce_bytes);
  checkpoint_save_seconds_->Remove(job.checkpoint_save_seconds);
  for (const auto& [name, gauge] : job.eval) eval_metric_->Remove(gauge);
  for (auto& [rank, series] : job.ranks) {
    step_->Remove(series.step);
    loss_->Remove(series.loss);
    samples_per_second_->Remove(series.samples_per_second);
    samples_->Remove(series.samples);
    bus_bandwidth_->Remove(series.bus_bandwidth);
  }
}

absl::Status TrainingMetrics::Sweep(absl::Time now) {
  std::vector<std::string> ids;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = refused_.begin(); it != refused_.end();) {
      it = it->second.until <= now ? refused_.erase(it) : std::next(it);
    }
    for (const auto& [id, job] : jobs_) ids.push_back(id);
  }
  const std::set<std::string> asked(ids.begin(), ids.end());
  absl::StatusOr<std::map<std::string, JobStatus>> found = directory_->Lookup(ids);
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = jobs_.begin(); it != jobs_.end();) {
    JobSeries& job = *it->second;
    bool gone = false;  // deleted from the directory
    if (found.ok()) {
      auto status = found->find(it->first);
      gone = status == found->end() && asked.count(it->first) > 0;
      if (status != found->end()) {
        job.current_attempt = std::max(job.current_attempt, status->second.current_attempt);
        if (status->second.terminal && !job.terminal) job.ended = now;
        job.terminal = status->second.terminal;
      }
    }
    if (gone || now - job.ended >= options_.finished_job_ttl ||
        now - job.last_report >= options_.idle_job_ttl) {
      RemoveSeries(job);
      it = jobs_.erase(it);
    } else {
      ++it;
    }
  }
  return found.status();
}

std::string TrainingMetrics::Scrape() const {
  std::vector<prometheus::MetricFamily> families = registry_->Collect();
  prometheus::MetricFamily phases{
      "gradhub_step_phase_seconds",
      "Time of each phase of a rank's steps: rate(_sum) / rate(_count) is the mean over a "
      "window. backward includes the allreduces it overlapped; allreduce_wait is what it did "
      "not hide; step is the whole step, data loading included.",
      prometheus::MetricType::Summary,
      {}};
  prometheus::MetricFamily jobs{
      "gradhub_telemetry_jobs", "Jobs that have series here.", prometheus::MetricType::Gauge, {}};
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [id, job] : jobs_) {
      for (const auto& [rank, series] : job->ranks) {
        for (size_t i = 0; i < kPhases.size(); ++i) {
          prometheus::ClientMetric& metric = phases.metric.emplace_back();
          metric.label = {{"job_id", id}, {"phase", kPhases[i]}, {"rank", std::to_string(rank)}};
          metric.summary.sample_count = series.phase_count;
          metric.summary.sample_sum = series.phase_sum[i];
        }
      }
    }
    jobs.metric.emplace_back().gauge.value = static_cast<double>(jobs_.size());
  }
  families.push_back(std::move(phases));
  families.push_back(std::move(jobs));
  return prometheus::TextSerializer().Serialize(families);
}

}  // namespace gradhub::metrics
