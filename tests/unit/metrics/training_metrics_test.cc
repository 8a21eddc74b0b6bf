// TrainingMetrics' rules without a database or a server: a fake job directory says which jobs
// exist, and the exposition text says what Prometheus would see.
#include "services/metrics/training_metrics.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <regex>

namespace gradhub::metrics {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kJob[] = "0f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9";
constexpr char kOtherJob[] = "11111111-2222-4333-8444-555555555555";
constexpr char kThirdJob[] = "aaaaaaaa-bbbb-4ccc-8ddd-eeeeeeeeeeee";

class FakeDirectory : public JobDirectory {
 public:
  absl::StatusOr<std::map<std::string, JobStatus>> Lookup(
      const std::vector<std::string>& job_ids) override {
    ++lookups;
    if (!status.ok()) return status;
    std::map<std::string, JobStatus> found;
    for (const auto& id : job_ids) {
      if (auto it = jobs.find(id); it != jobs.end()) found[id] = it->second;
    }
    return found;
  }
  std::map<std::string, JobStatus> jobs;
  absl::Status status;
  int lookups = 0;
};

v1::TelemetryBatch Batch(const std::string& job, int attempt, int rank,
                         std::vector<int64_t> steps) {
  v1::TelemetryBatch batch;
  batch.set_job(std::string("jobs/") + job);
  batch.set_attempt(attempt);
  batch.set_rank(rank);
  for (int64_t step : steps) {
    v1::StepTelemetry* s = batch.add_steps();
    s->set_step(step);
    s->set_loss(1.0 / static_cast<double>(step));
    s->set_learning_rate(0.1);
    s->set_samples(16);
    s->set_samples_per_second(1600);
    s->set_forward_seconds(0.002);
    s->set_backward_seconds(0.004);
    s->set_allreduce_wait_seconds(0.001);
    s->set_optimizer_seconds(0.001);
    s->set_step_seconds(0.01);
    s->set_allreduce_bytes(1000);
    s->set_allreduce_seconds(0.003);
    s->set_bus_bandwidth_bytes_per_second(5e8);
  }
  return batch;
}

// The value of the one sample whose line starts with `series` (name and labels, exactly as
// exposed), or NaN when there is none.
double Sample(const std::string& text, const std::string& series) {
  const std::regex line("(^|\n)" +
                        std::regex_replace(series, std::regex(R"([{}\[\]().+*?^$|\\])"), R"(\$&)") +
                        " ([^ \n]+)");
  std::smatch match;
  if (!std::regex_search(text, match, line)) return std::nan("");
  return std::stod(match[2].str());
}

double Dropped(const std::string& text, const std::string& reason) {
  return Sample(text, "gradhub_telemetry_dropped_total{reason=\"" + reason + "\"}");
}

class TrainingMetricsTest : public ::testing::Test {
 protected:
  TrainingMetricsTest() {
    directory_.jobs[kJob] = {1, 2, false};
    directory_.jobs[kOtherJob] = {1, 1, false};
    directory_.jobs[kThirdJob] = {1, 1, false};
  }
  FakeDirectory directory_;
  TrainingMetricsOptions options_{.max_jobs = 2,
                                  .finished_job_ttl = absl::Minutes(1),
                                  .idle_job_ttl = absl::Minutes(10),
                                  .refusal_ttl = absl::Seconds(30),
                                  .max_eval_metrics_per_job = 2};
  absl::Time now_ = absl::FromUnixSeconds(1700000000);
};

TEST_F(TrainingMetricsTest, StepsBecomeSeriesLabelledByJobAndRank) {
  TrainingMetrics metrics(&directory_, options_);
  v1::TelemetryBatch first = Batch(kJob, 1, 0, {1, 2, 3});
  first.mutable_steps(2)->set_checkpoint_save_seconds(0.2);
  EXPECT_EQ(metrics.Record(first, now_).accepted, 3);
  EXPECT_EQ(metrics.Record(Batch(kJob, 1, 1, {1, 2}), now_).accepted, 2);
  const std::string text = metrics.Scrape();
  const std::string rank0 = std::string("{job_id=\"") + kJob + "\",rank=\"0\"}";
  EXPECT_EQ(Sample(text, "gradhub_training_step" + rank0), 3);
  EXPECT_NEAR(Sample(text, "gradhub_training_loss" + rank0), 1.0 / 3, 1e-9);
  EXPECT_EQ(Sample(text, "gradhub_samples_total" + rank0), 48);
  EXPECT_EQ(Sample(text, "gradhub_samples_per_second" + rank0), 1600);
  EXPECT_EQ(Sample(text, "gradhub_allreduce_bus_bandwidth_bytes_per_second" + rank0), 5e8);
  const std::string job = std::string("{job_id=\"") + kJob + "\"}";
  EXPECT_EQ(Sample(text, "gradhub_learning_rate" + job), 0.1);
  EXPECT_EQ(Sample(text, "gradhub_allreduce_bytes_total" + job), 5000);
  EXPECT_EQ(Sample(text, "gradhub_allreduce_seconds_count" + job), 5);
  EXPECT_EQ(Sample(text, "gradhub_checkpoint_save_seconds_count" + job), 1);
  EXPECT_EQ(Sample(text, "gradhub_checkpoint_save_seconds_sum" + job), 0.2);
  // The step phases: a summary whose _sum / _count is the mean time of the phase.
  const std::string backward =
      std::string("{job_id=\"") + kJob + "\",phase=\"backward\",rank=\"0\"}";
  EXPECT_EQ(Sample(text, "gradhub_step_phase_seconds_count" + backward), 3);
  EXPECT_NEAR(Sample(text, "gradhub_step_phase_seconds_sum" + backward), 0.012, 1e-12);
  EXPECT_EQ(Sample(text, "gradhub_telemetry_steps_total"), 5);
  EXPECT_EQ(Sample(text, "gradhub_telemetry_jobs"), 1);
  // The directory is asked once per new job, not per batch.
  EXPECT_EQ(directory_.lookups, 1);
}

// A script rank that does not pass a learning rate sends NaN: the job's gauge keeps the value
// another rank reported instead of flickering.
TEST_F(TrainingMetricsTest, ANaNLearningRateLeavesTheJobsGaugeAlone) {
  TrainingMetrics metrics(&directory_, options_);
  v1::TelemetryBatch without = Batch(kJob, 1, 1, {1, 2});
  for (v1::StepTelemetry& step : *without.mutable_steps()) step.set_learning_rate(std::nan(""));
  EXPECT_EQ(metrics.Record(without, now_).accepted, 2);
  const std::string job = std::string("{job_id=\"") + kJob + "\"}";
  // None reported yet: NaN (the series is there), not a learning rate of 0.
  EXPECT_THAT(metrics.Scrape(), HasSubstr("gradhub_learning_rate" + job + " "));
  EXPECT_TRUE(std::isnan(Sample(metrics.Scrape(), "gradhub_learning_rate" + job)));
  metrics.Record(Batch(kJob, 1, 0, {1}), now_);
  v1::TelemetryBatch later = Batch(kJob, 1, 1, {3});
  later.mutable_steps(0)->set_learning_rate(std::nan(""));
  EXPECT_EQ(metrics.Record(later, now_).accepted, 1);
  EXPECT_EQ(Sample(metrics.Scrape(), "gradhub_learning_rate" + job), 0.1);
}

TEST_F(TrainingMetricsTest, ResentStepsAreDroppedAsDuplicates) {
  TrainingMetrics metrics(&directory_, options_);
  metrics.Record(Batch(kJob, 1, 0, {1, 2, 3}), now_);
  const BatchOutcome again = metrics.Record(Batch(kJob, 1, 0, {2, 3, 4}), now_);
  EXPECT_EQ(again.accepted, 1);
  EXPECT_EQ(again.dropped, 2);
  EXPECT_EQ(Dropped(metrics.Scrape(), "duplicate_step"), 2);
}

TEST_F(TrainingMetricsTest, OnlyTheCurrentAttemptCounts) {
  TrainingMetrics metrics(&directory_, options_);
  metrics.Record(Batch(kJob, 1, 0, {100, 101}), now_);
  // The job restarts: attempt 2 resumes from step 50, below what attempt 1 reached.
  directory_.jobs[kJob].current_attempt = 2;
  EXPECT_EQ(metrics.Record(Batch(kJob, 2, 0, {50, 51}), now_).accepted, 2);
  // A late batch of attempt 1 is stale, and costs no lookup.
  const int lookups = directory_.lookups;
  EXPECT_EQ(metrics.Record(Batch(kJob, 1, 0, {102}), now_).dropped, 1);
  EXPECT_EQ(directory_.lookups, lookups);
  const std::string text = metrics.Scrape();
  EXPECT_EQ(Dropped(text, "stale_attempt"), 1);
  EXPECT_EQ(Sample(text, std::string("gradhub_training_step{job_id=\"") + kJob + "\",rank=\"0\"}"),
            51);
  // An attempt the directory has never heard of is refused as well.
  EXPECT_EQ(metrics.Record(Batch(kJob, 7, 0, {1}), now_).dropped, 1);
}

TEST_F(TrainingMetricsTest, UnknownJobsAreRefusedAndTheRefusalRemembered) {
  TrainingMetrics metrics(&directory_, options_);
  const std::string unknown = "99999999-9999-4999-8999-999999999999";
  EXPECT_EQ(metrics.Record(Batch(unknown, 1, 0, {1}), now_).dropped, 1);
  EXPECT_EQ(metrics.Record(Batch(unknown, 1, 0, {2}), now_ + absl::Seconds(10)).dropped, 1);
  EXPECT_EQ(directory_.lookups, 1);
  // After refusal_ttl the directory is asked again (the job may have been created since).
  metrics.Record(Batch(unknown, 1, 0, {3}), now_ + absl::Seconds(31));
  EXPECT_EQ(directory_.lookups, 2);
  EXPECT_EQ(Dropped(metrics.Scrape(), "unknown_job"), 3);
}

TEST_F(TrainingMetricsTest, RanksOutsideTheWorldAreRefused) {
  TrainingMetrics metrics(&directory_, options_);
  EXPECT_EQ(metrics.Record(Batch(kJob, 1, 2, {1}), now_).dropped, 1);  // world size 2
  const std::string text = metrics.Scrape();
  EXPECT_EQ(Dropped(text, "invalid"), 1);
  EXPECT_THAT(text, Not(HasSubstr("rank=\"2\"")));
}

TEST_F(TrainingMetricsTest, JobsBeyondTheLimitAreRefusedAndCounted) {
  TrainingMetrics metrics(&directory_, options_);  // max_jobs 2
  metrics.Record(Batch(kJob, 1, 0, {1}), now_);
  metrics.Record(Batch(kOtherJob, 1, 0, {1}), now_);
  EXPECT_EQ(metrics.Record(Batch(kThirdJob, 1, 0, {1, 2}), now_).dropped, 2);
  const std::string text = metrics.Scrape();
  EXPECT_EQ(Dropped(text, "job_limit"), 2);
  EXPECT_THAT(text, Not(HasSubstr(kThirdJob)));
  EXPECT_EQ(metrics.live_jobs(), 2);
}

TEST_F(TrainingMetricsTest, FinishedJobsLoseTheirSeriesAfterTheTtl) {
  TrainingMetrics metrics(&directory_, options_);
  metrics.Record(Batch(kJob, 1, 0, {1}), now_);
  directory_.jobs[kJob].terminal = true;
  ASSERT_TRUE(metrics.Sweep(now_ + absl::Seconds(5)).ok());
  // Still shown (a dashboard sees the end), and the last steps of its ranks still count.
  EXPECT_EQ(metrics.Record(Batch(kJob, 1, 0, {2}), now_ + absl::Seconds(6)).accepted, 1);
  EXPECT_THAT(metrics.Scrape(), HasSubstr(kJob));
  ASSERT_TRUE(metrics.Sweep(now_ + absl::Seconds(5) + absl::Minutes(1)).ok());
  EXPECT_THAT(metrics.Scrape(), Not(HasSubstr(kJob)));
  EXPECT_EQ(metrics.live_jobs(), 0);
  // A batch after that does not bring the series back.
  EXPECT_EQ(metrics.Record(Batch(kJob, 1, 0, {3}), now_ + absl::Minutes(2)).dropped, 1);
  EXPECT_EQ(Dropped(metrics.Scrape(), "finished_job"), 1);
  EXPECT_THAT(metrics.Scrape(), Not(HasSubstr(kJob)));
}

TEST_F(TrainingMetricsTest, SilentJobsLoseTheirSeriesAfterTheIdleTtl) {
  TrainingMetrics metrics(&directory_, options_);
  metrics.Record(Batch(kJob, 1, 0, {1}), now_);
  metrics.Record(Batch(kOtherJob, 1, 0, {1}), now_ + absl::Minutes(9));
  ASSERT_TRUE(metrics.Sweep(now_ + absl::Minutes(10)).ok());
  const std::string text = metrics.Scrape();
  EXPECT_THAT(text, Not(HasSubstr(kJob)));
  EXPECT_THAT(text, HasSubstr(kOtherJob));
  // Its slot under max_jobs is free again.
  EXPECT_EQ(metrics.Record(Batch(kThirdJob, 1, 0, {1}), now_ + absl::Minutes(10)).accepted, 1);
}

TEST_F(TrainingMetricsTest, AnUnreadableDirectoryDropsNewJobsAndKeepsKnownOnes) {
  TrainingMetrics metrics(&directory_, options_);
  metrics.Record(Batch(kJob, 1, 0, {1}), now_);
  directory_.status = absl::UnavailableError("database down");
  EXPECT_EQ(metrics.Record(Batch(kJob, 1, 0, {2}), now_).accepted, 1);
  EXPECT_EQ(metrics.Record(Batch(kOtherJob, 1, 0, {1}), now_).dropped, 1);
  EXPECT_FALSE(metrics.Sweep(now_).ok());
  EXPECT_THAT(metrics.Scrape(), HasSubstr(kJob));
  EXPECT_EQ(Dropped(metrics.Scrape(), "unavailable"), 1);
}

TEST_F(TrainingMetricsTest, EvaluationMetricsAreKeptUpToTheLimitOfNames) {
  TrainingMetrics metrics(&directory_, options_);  // two names per job
  v1::TelemetryBatch batch = Batch(kJob, 1, 0, {10});
  auto& eval = *batch.mutable_steps(0)->mutable_eval_metrics();
  eval["accuracy"] = 0.9;
  eval["loss"] = 0.3;
  eval["zz_extra"] = 1;
  metrics.Record(batch, now_);
  const std::string text = metrics.Scrape();
  EXPECT_EQ(
      Sample(text, std::string("gradhub_eval_metric{job_id=\"") + kJob + "\",name=\"accuracy\"}"),
      0.9);
  EXPECT_THAT(text, Not(HasSubstr("zz_extra")));
}

TEST_F(TrainingMetricsTest, TrainerDropsAreCountedOnceFromTheCumulativeCount) {
  TrainingMetrics metrics(&directory_, options_);
  v1::TelemetryBatch batch = Batch(kJob, 1, 0, {1});
  batch.set_dropped_steps(5);
  metrics.Record(batch, now_);
  metrics.Record(batch, now_);  // resent: no new drops
  batch = Batch(kJob, 1, 0, {2});
  batch.set_dropped_steps(7);
  metrics.Record(batch, now_);
  EXPECT_EQ(Dropped(metrics.Scrape(), "trainer_queue_full"), 7);
}

// A pipeline stage's steps: the traffic, the wait, the bubble and the activation memory of
// `stage`.
v1::TelemetryBatch PipelineBatch(int rank, int stage, std::vector<int64_t> steps) {
  v1::TelemetryBatch batch = Batch(kJob, 1, rank, steps);
  for (v1::StepTelemetry& step : *batch.mutable_steps()) {
    step.set_pipeline_stage(stage);
    step.set_p2p_bytes(1000 * step.step());
    step.set_p2p_wait_seconds(0.001);
    step.set_bubble_fraction(0.1 * static_cast<double>(step.step()));
    step.set_peak_activation_bytes(4096 * step.step());
  }
  return batch;
}

std::string PipelineLabels(int rank, int stage) {
  return std::string("{job_id=\"") + kJob + "\",rank=\"" + std::to_string(rank) + "\",stage=\"" +
         std::to_string(stage) + "\"}";
}

TEST_F(TrainingMetricsTest, PipelineStagesGetSeriesLabelledByStage) {
  TrainingMetrics metrics(&directory_, options_);
  // Stage 0 reports pipeline_stage 0 (the proto's zero): its traffic says it is a stage.
  EXPECT_EQ(metrics.Record(PipelineBatch(0, 0, {1, 2, 3}), now_).accepted, 3);
  EXPECT_EQ(metrics.Record(PipelineBatch(1, 1, {1}), now_).accepted, 1);
  const std::string text = metrics.Scrape();
  const std::string stage0 = PipelineLabels(0, 0);
  EXPECT_EQ(Sample(text, "gradhub_pipeline_p2p_bytes_total" + stage0), 6000);
  EXPECT_NEAR(Sample(text, "gradhub_pipeline_p2p_wait_seconds_total" + stage0), 0.003, 1e-12);
  // The gauges: the batch's mean bubble and its largest peak.
  EXPECT_NEAR(Sample(text, "gradhub_pipeline_bubble_fraction" + stage0), 0.2, 1e-12);
  EXPECT_EQ(Sample(text, "gradhub_pipeline_peak_activation_bytes" + stage0), 3 * 4096);
  EXPECT_EQ(Sample(text, "gradhub_pipeline_p2p_bytes_total" + PipelineLabels(1, 1)), 1000);
  // A later batch adds to the counters and replaces the gauges.
  metrics.Record(PipelineBatch(0, 0, {4}), now_);
  const std::string later = metrics.Scrape();
  EXPECT_EQ(Sample(later, "gradhub_pipeline_p2p_bytes_total" + stage0), 10000);
  EXPECT_NEAR(Sample(later, "gradhub_pipeline_bubble_fraction" + stage0), 0.4, 1e-12);
  EXPECT_EQ(Sample(later, "gradhub_pipeline_peak_activation_bytes" + stage0), 4 * 4096);
}

TEST_F(TrainingMetricsTest, DataParallelRanksHaveNoPipelineSeries) {
  TrainingMetrics metrics(&directory_, options_);
  metrics.Record(Batch(kJob, 1, 0, {1, 2}), now_);
  EXPECT_THAT(metrics.Scrape(), Not(HasSubstr("gradhub_pipeline_p2p_bytes_total{")));
  EXPECT_THAT(metrics.Scrape(), Not(HasSubstr("gradhub_pipeline_bubble_fraction{")));
}

// Unmeasured values (a bubble outside (0, 1], no peak, e.g. -1 while a profiler held the
// allocator's hook) leave the gauges NaN rather than claiming 0.
TEST_F(TrainingMetricsTest, UnmeasuredPipelineGaugesStayNaN) {
  TrainingMetrics metrics(&directory_, options_);
  v1::TelemetryBatch batch = PipelineBatch(1, 1, {1});
  batch.mutable_steps(0)->set_bubble_fraction(std::nan(""));
  batch.mutable_steps(0)->set_peak_activation_bytes(-1);
  metrics.Record(batch, now_);
  const std::string text = metrics.Scrape();
  EXPECT_TRUE(std::isnan(Sample(text, "gradhub_pipeline_bubble_fraction" + PipelineLabels(1, 1))));
  EXPECT_TRUE(
      std::isnan(Sample(text, "gradhub_pipeline_peak_activation_bytes" + PipelineLabels(1, 1))));
  EXPECT_EQ(Sample(text, "gradhub_pipeline_p2p_bytes_total" + PipelineLabels(1, 1)), 1000);
}

// A rank has one stage; one that reports another moves its series rather than adding some.
TEST_F(TrainingMetricsTest, ARankReportingAnotherStageMovesItsSeries) {
  TrainingMetrics metrics(&directory_, options_);
  metrics.Record(PipelineBatch(1, 1, {1}), now_);
  metrics.Record(PipelineBatch(1, 0, {2}), now_);
  const std::string text = metrics.Scrape();
  EXPECT_THAT(text, Not(HasSubstr("stage=\"1\"")));
  EXPECT_EQ(Sample(text, "gradhub_pipeline_p2p_bytes_total" + PipelineLabels(1, 0)), 2000);
}

TEST_F(TrainingMetricsTest, PipelineSeriesGoWithTheirJob) {
  TrainingMetrics metrics(&directory_, options_);
  metrics.Record(PipelineBatch(0, 0, {1}), now_);
  ASSERT_TRUE(metrics.Sweep(now_ + absl::Minutes(10)).ok());  // idle_job_ttl
  EXPECT_THAT(metrics.Scrape(), Not(HasSubstr("stage=")));
}

TEST(JobIdOfTest, AcceptsOnlyJobsSlashUuid) {
  EXPECT_EQ(JobIdOf(std::string("jobs/") + kJob), kJob);
  EXPECT_EQ(JobIdOf("jobs/0F1E2D3C-4B5A-4978-8695-A4B3C2D1E0F9"), kJob);
  EXPECT_EQ(JobIdOf(kJob), "");
  EXPECT_EQ(JobIdOf("jobs/x"), "");
  EXPECT_EQ(JobIdOf("jobs/0f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9,aaaaaaa"), "");
  EXPECT_EQ(JobIdOf("jobs/0f1e2d3c}4b5a-4978-8695-a4b3c2d1e0f9"), "");
}

}  // namespace
}  // namespace gradhub::metrics
