#include "services/metrics/training_metrics.h"

#include <prometheus/text_serializer.h>

#include <vector>

#include "services/metrics/training_series.h"

namespace gradhub::metrics {

struct TrainingMetrics::RankEntry {
  RankProgress progress;
  RankSeries series;
};

struct TrainingMetrics::JobEntry {
  explicit JobEntry(absl::Time now) : state(now) {}
  JobState state;
  JobSeries series;
  std::map<int32_t, RankEntry> ranks;
};

TrainingMetrics::TrainingMetrics(JobDirectory* directory, TrainingMetricsOptions options)
    : directory_(directory),
      options_(options),
      registry_(std::make_shared<prometheus::Registry>()),
      families_(std::make_unique<SeriesFamilies>(*registry_, options.max_eval_metrics_per_job)),
      counters_(std::make_unique<TelemetryCounters>(*registry_)),
      refused_(options.refusal_ttl) {}

TrainingMetrics::~TrainingMetrics() = default;

void TrainingMetrics::CountDropped(DropReason reason, int64_t steps) {
  counters_->Drop(reason, steps);
}

void TrainingMetrics::AddStreams(int delta) { counters_->AddStreams(delta); }

int TrainingMetrics::live_jobs() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(jobs_.size());
}

BatchOutcome TrainingMetrics::Record(const v1::TelemetryBatch& batch, absl::Time now) {
  const std::string id = JobIdOf(batch.job());
  const int64_t steps = batch.steps_size();
  std::unique_lock<std::mutex> lock(mu_);
  DropReason refused = DropReason::kInvalid;
  JobEntry* job = Admit(id, batch.attempt(), now, lock, &refused);
  if (job == nullptr || !job->state.InWorld(batch.rank())) {
    counters_->Drop(job == nullptr ? refused : DropReason::kInvalid, steps);
    return {0, steps};
  }
  job->state.Reported(now);
  RankEntry& rank = Rank(id, *job, batch.rank());
  rank.progress.StartBatch(batch.attempt());
  counters_->Drop(DropReason::kTrainerQueueFull,
                  rank.progress.NewTrainerDrops(batch.dropped_steps()));
  std::vector<const v1::StepTelemetry*> accepted;
  accepted.reserve(batch.steps_size());
  for (const v1::StepTelemetry& step : batch.steps()) {
    if (rank.progress.Accept(step.step())) accepted.push_back(&step);
  }
  families_->Apply(id, batch.rank(), accepted, job->series, rank.series);
  const BatchOutcome outcome = {static_cast<int64_t>(accepted.size()),
                                steps - static_cast<int64_t>(accepted.size())};
  counters_->Drop(DropReason::kDuplicateStep, outcome.dropped);
  counters_->Accept(outcome.accepted);
  return outcome;
}

TrainingMetrics::JobEntry* TrainingMetrics::Admit(const std::string& id, int32_t attempt,
                                                  absl::Time now,
                                                  std::unique_lock<std::mutex>& lock,
                                                  DropReason* refused) {
  JobEntry* entry = nullptr;
  if (AdmitLocked(id, attempt, now, nullptr, &entry, refused) != Admission::kAskDirectory) {
    return entry;
  }
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
    refused_.Refuse(id, DropReason::kUnknownJob, now);
    *refused = DropReason::kUnknownJob;
    return nullptr;
  }
  AdmitLocked(id, attempt, now, &it->second, &entry, refused);
  return entry;
}

// Rules 1-3 with what is known: `status` is the directory's answer, or nullptr when it was not
// asked (then kAskDirectory means: ask it).
TrainingMetrics::Admission TrainingMetrics::AdmitLocked(const std::string& id, int32_t attempt,
                                                        absl::Time now, const JobStatus* status,
                                                        JobEntry** entry, DropReason* refused) {
  if (std::optional<DropReason> reason = refused_.Find(id, now)) {
    *refused = *reason;
    return Admission::kRefused;
  }
  auto it = jobs_.find(id);
  if (it == jobs_.end()) {
    if (status == nullptr) return Admission::kAskDirectory;
    if (std::optional<DropReason> reason =
            RefuseNewJob(*status, static_cast<int>(jobs_.size()), options_.max_jobs)) {
      refused_.Refuse(id, *reason, now);
      *refused = *reason;
      return Admission::kRefused;
    }
    auto job = std::make_unique<JobEntry>(now);
    job->series = families_->AddJob(id);
    it = jobs_.emplace(id, std::move(job)).first;
  }
  JobEntry& job = *it->second;
  if (status != nullptr) job.state.Admit(*status);
  switch (job.state.CheckAttempt(attempt, status != nullptr)) {
    case JobState::AttemptCheck::kAskDirectory:
      return Admission::kAskDirectory;
    case JobState::AttemptCheck::kStale:
      *refused = DropReason::kStaleAttempt;
      return Admission::kRefused;
    case JobState::AttemptCheck::kCurrent:
      break;
  }
  *entry = &job;
  return Admission::kAdmitted;
}

TrainingMetrics::RankEntry& TrainingMetrics::Rank(const std::string& id, JobEntry& job,
                                                  int32_t rank) {
  auto [it, inserted] = job.ranks.try_emplace(rank);
  if (inserted) it->second.series = families_->AddRank(id, rank);
  return it->second;
}

void TrainingMetrics::RemoveSeries(const JobEntry& job) {
  std::vector<const RankSeries*> ranks;
  for (const auto& [rank, entry] : job.ranks) ranks.push_back(&entry.series);
  families_->Remove(job.series, ranks);
}

bool TrainingMetrics::SweepJob(const std::string& id, JobEntry& job, absl::Time now,
                               const absl::StatusOr<std::map<std::string, JobStatus>>& found,
                               const std::set<std::string>& asked) {
  bool gone = false;  // deleted from the directory
  if (found.ok()) {
    auto status = found->find(id);
    gone = status == found->end() && asked.count(id) > 0;
    if (status != found->end()) job.state.Sweep(status->second, now);
  }
  return gone || job.state.Expired(now, options_.finished_job_ttl, options_.idle_job_ttl);
}

absl::Status TrainingMetrics::Sweep(absl::Time now) {
  std::vector<std::string> ids;
  {
    std::lock_guard<std::mutex> lock(mu_);
    refused_.Prune(now);
    for (const auto& [id, job] : jobs_) ids.push_back(id);
  }
  const std::set<std::string> asked(ids.begin(), ids.end());
  absl::StatusOr<std::map<std::string, JobStatus>> found = directory_->Lookup(ids);
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = jobs_.begin(); it != jobs_.end();) {
    if (SweepJob(it->first, *it->second, now, found, asked)) {
      RemoveSeries(*it->second);
      it = jobs_.erase(it);
    } else {
      ++it;
    }
  }
  return found.status();
}

std::string TrainingMetrics::Scrape() const {
  std::vector<prometheus::MetricFamily> families = registry_->Collect();
  prometheus::MetricFamily phases = StepPhaseFamily();
  prometheus::MetricFamily jobs{
      "gradhub_telemetry_jobs", "Jobs that have series here.", prometheus::MetricType::Gauge, {}};
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [id, job] : jobs_) {
      for (const auto& [rank, entry] : job->ranks) AppendStepPhases(id, rank, entry.series, phases);
    }
    jobs.metric.emplace_back().gauge.value = static_cast<double>(jobs_.size());
  }
  families.push_back(std::move(phases));
  families.push_back(std::move(jobs));
  return prometheus::TextSerializer().Serialize(families);
}

}  // namespace gradhub::metrics
