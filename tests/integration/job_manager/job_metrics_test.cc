// A job's training history against a real PostgreSQL: rank 0's progress and evaluation lines
// shipped through NodeManager::StoreLogs as an agent ships them, their bound per job, and
// JobManager::GetJobMetrics (downsampling, validation, tenants); and the job events rank 0's
// lines report (trainer_events.h: skipped checkpoints). The pure parts of job_metrics.h and
// trainer_events.h (line parsing, the downsampling choice) are tested here too, without a
// server.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "services/api/job_manager.h"
#include "services/api/job_metrics.h"
#include "services/api/node_manager.h"
#include "services/api/trainer_events.h"
#include "tests/integration/db/db_test_util.h"
#include "tests/support/job_specs.h"

namespace gradhub::api {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Lines as gradhub-trainer prints them (trainer.cc, Emit).
std::string Progress(int64_t step, double loss, double lr = 0.1, double samples_per_second = 500,
                     int64_t total_steps = 0) {
  return absl::StrCat(R"({"event":"progress","step":)", step, R"(,"totalSteps":)", total_steps,
                      R"(,"epoch":0,"loss":)", loss, R"(,"lr":)", lr, R"(,"samplesPerSecond":)",
                      samples_per_second, R"(,"forwardSeconds":0.001,"allreduceBytes":1024})");
}

std::string Eval(int64_t step, double accuracy, double loss = 0.5) {
  return absl::StrCat(R"({"event":"eval","step":)", step, R"(,"totalSteps":0,"eval.accuracy":)",
                      accuracy, R"(,"eval.loss":)", loss, "}");
}

// Rank 0's record of a checkpoint it skipped (progress_reporter.cc, ReportCheckpointSkipped).
std::string Skipped(int64_t step, int64_t in_flight_step, double seconds) {
  return absl::StrCat(R"({"event":"checkpoint_skipped","step":)", step,
                      R"(,"totalSteps":100,"checkpointInFlightStep":)", in_flight_step,
                      R"(,"checkpointInFlightSeconds":)", seconds, "}");
}

std::vector<int64_t> Steps(const v1::JobMetrics& metrics) {
  std::vector<int64_t> steps;
  for (const v1::JobMetricPoint& point : metrics.points()) steps.push_back(point.step());
  return steps;
}

class JobMetricsTest : public db::DatabaseTest {
 protected:
  void SetUp() override {
    db::DatabaseTest::SetUp();
    Migrate();
    pool_ = MakePool(4);
    jobs_ = std::make_unique<JobManager>(pool_.get(), SpecLimits{.max_world_size = 64});
    nodes_ = std::make_unique<NodeManager>(pool_.get(), NodeManagerOptions{});
    tenant_a_ = MakeTenant("tenant-a");
    tenant_b_ = MakeTenant("tenant-b");
  }

  int64_t MakeTenant(const std::string& name) {
    auto result = pool_->Exec("INSERT INTO tenants (name) VALUES ($1) RETURNING id", {name});
    EXPECT_TRUE(result.ok()) << result.status();
    return result->row(0).Get<int64_t>("id");
  }

  // A job of tenant a whose current attempt is 1.
  std::string NewJob() {
    auto job = jobs_->CreateJob(tenant_a_, testing::MinimalJobSpec(), "");
    EXPECT_TRUE(job.ok()) << job.status();
    StartAttempt(job->name(), 1);
    // Progress (JobProgress.total_steps) is taken from SCHEDULED on.
    EXPECT_TRUE(jobs_->Transition(job->name(), v1::Job::SCHEDULED).ok());
    return job->name();
  }

  // What the scheduler records when it places an attempt, as far as log shipping cares.
  void StartAttempt(const std::string& name, int32_t attempt) {
    const std::string id = JobId(name);
    ASSERT_TRUE(pool_
                    ->Exec("INSERT INTO job_attempts (job_id, attempt, rendezvous_prefix)"
                           " VALUES ($1::uuid, $2, $3)",
                           {id, attempt, absl::StrCat(name, "/attempts/", attempt, "/")})
                    .ok());
    ASSERT_TRUE(
        pool_->Exec("UPDATE jobs SET current_attempt = $2 WHERE id = $1::uuid", {id, attempt})
            .ok());
  }

  // One ReportLogs batch of an agent.
  void Ship(const std::string& name, int32_t attempt, int64_t first_seq,
            const std::vector<std::string>& lines, int32_t rank = 0,
            v1::LogEntry::Stream stream = v1::LogEntry::STDOUT) {
    v1::ReportLogsRequest request;
    request.set_job(name);
    request.set_attempt(attempt);
    request.set_rank(rank);
    request.set_stream(stream);
    request.set_first_seq(first_seq);
    for (const std::string& line : lines) request.add_lines(line);
    auto acked = nodes_->StoreLogs(request);
    ASSERT_TRUE(acked.ok()) << acked.status();
  }

  v1::JobMetrics Metrics(const std::string& name, int32_t max_points = 10000, int64_t tenant = -1) {
    v1::GetJobMetricsRequest request;
    request.set_name(name);
    request.set_max_points(max_points);
    auto metrics = jobs_->GetJobMetrics(tenant < 0 ? tenant_a_ : tenant, request);
    EXPECT_TRUE(metrics.ok()) << metrics.status();
    return metrics.ok() ? *metrics : v1::JobMetrics();
  }

  // The job's events of `type`, oldest first, as its tenant lists them.
  std::vector<v1::JobEvent> EventsOf(const std::string& name, v1::JobEvent::Type type) {
    v1::ListJobEventsRequest request;
    request.set_parent(name);
    request.set_filter("type=" + v1::JobEvent::Type_Name(type));
    auto listed = jobs_->ListJobEvents(tenant_a_, request);
    EXPECT_TRUE(listed.ok()) << listed.status();
    if (!listed.ok()) return {};
    return {listed->events().begin(), listed->events().end()};
  }

  int64_t Count(const std::string& sql, const std::string& name) {
    auto result = pool_->Exec(sql, {JobId(name)});
    EXPECT_TRUE(result.ok()) << result.status();
    return result.ok() ? result->row(0).Get<int64_t>("n") : -1;
  }

  std::unique_ptr<db::Pool> pool_;
  std::unique_ptr<JobManager> jobs_;
  std::unique_ptr<NodeManager> nodes_;
  int64_t tenant_a_ = 0;
  int64_t tenant_b_ = 0;
};

TEST_F(JobMetricsTest, RecordsRankZerosProgressAndEvaluationLines) {
  const std::string name = NewJob();
  Ship(name, 1, 1,
       {"gradhub-trainer: step 10/40 loss 2.5", Progress(10, 2.5, 0.1, 480, 40), Progress(20, 1.5),
        Eval(20, 0.75, 0.9),
        // The trainer prints a NaN loss as null: the point has no loss, but the rest.
        R"({"event":"progress","step":30,"loss":null,"lr":0.05,"samplesPerSecond":510})",
        R"({"event":"eval","step":30,"eval.accuracy":null})", "not json", R"({"event":"progress")",
        R"({"event":"done","rank":0,"step":40,"eval.accuracy":0.9})"});
  // Not the history: other ranks, stderr.
  Ship(name, 1, 1, {Progress(15, 9.0)}, /*rank=*/1);
  Ship(name, 1, 1, {Progress(25, 9.0)}, /*rank=*/0, v1::LogEntry::STDERR);
  // The evaluation of step 30 in a later batch joins its progress point.
  Ship(name, 1, 10, {Eval(30, 0.8)});
  Ship(name, 1, 11, {Progress(40, 0.5, 0.1, 500, 40)});

  const v1::JobMetrics metrics = Metrics(name);
  EXPECT_EQ(metrics.name(), name);
  EXPECT_EQ(metrics.recorded_points(), 4);
  EXPECT_EQ(metrics.total_steps(), 40);
  ASSERT_THAT(Steps(metrics), ElementsAre(10, 20, 30, 40));
  const v1::JobMetricPoint& first = metrics.points(0);
  EXPECT_EQ(first.attempt(), 1);
  EXPECT_TRUE(first.has_time());
  EXPECT_DOUBLE_EQ(first.loss(), 2.5);
  EXPECT_DOUBLE_EQ(first.learning_rate(), 0.1);
  EXPECT_DOUBLE_EQ(first.samples_per_second(), 480);
  EXPECT_TRUE(first.eval_metrics().empty());
  const v1::JobMetricPoint& evaluated = metrics.points(1);
  EXPECT_DOUBLE_EQ(evaluated.loss(), 1.5);
  EXPECT_DOUBLE_EQ(evaluated.eval_metrics().at("accuracy"), 0.75);
  EXPECT_DOUBLE_EQ(evaluated.eval_metrics().at("loss"), 0.9);
  const v1::JobMetricPoint& no_loss = metrics.points(2);
  EXPECT_FALSE(no_loss.has_loss());
  EXPECT_DOUBLE_EQ(no_loss.learning_rate(), 0.05);
  EXPECT_DOUBLE_EQ(no_loss.eval_metrics().at("accuracy"), 0.8);

  // The history goes with its job.
  ASSERT_TRUE(pool_->Exec("DELETE FROM jobs WHERE id = $1::uuid", {JobId(name)}).ok());
  EXPECT_EQ(
      Count("SELECT count(*)::bigint AS n FROM job_metric_points WHERE job_id = $1::uuid", name),
      0);
}

// Job.progress from the same lines (RecordJobProgress): each value stays until a line that
// carries it says otherwise, so an evaluation, a "done" line or a null (NaN) never blanks the
// epoch, loss or learning rate; a finished job takes the lines shipped after its exit.
TEST_F(JobMetricsTest, JobProgressKeepsEachValueUntilALineCarriesIt) {
  const std::string name = NewJob();
  auto progress = [&] {
    const absl::StatusOr<v1::Job> job = jobs_->GetJob(tenant_a_, name);
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? job->progress() : v1::JobProgress();
  };
  EXPECT_FALSE(progress().has_last_report_time()) << "nothing reported yet";
  Ship(name, 1, 1,
       {R"({"event":"progress","step":10,"totalSteps":40,"epoch":1,"loss":2.5,"lr":0.05,)"
        R"("samplesPerSecond":18750})"});
  v1::JobProgress now = progress();
  EXPECT_EQ(now.step(), 10);
  EXPECT_EQ(now.total_steps(), 40);
  EXPECT_EQ(now.epoch(), 1);
  EXPECT_DOUBLE_EQ(now.loss(), 2.5);
  EXPECT_DOUBLE_EQ(now.learning_rate(), 0.05);
  EXPECT_DOUBLE_EQ(now.samples_per_second(), 18750);
  EXPECT_TRUE(now.eval_metrics().empty());
  EXPECT_TRUE(now.has_last_report_time());

  Ship(name, 1, 2,
       {Eval(20, 0.75, 0.9),
        R"({"event":"progress","step":20,"loss":null,"samplesPerSecond":19000})",
        R"({"event":"done","rank":0,"step":20,"loss":7,"eval.accuracy":0.1})"});
  now = progress();
  EXPECT_EQ(now.step(), 20);
  EXPECT_EQ(now.total_steps(), 40);
  EXPECT_EQ(now.epoch(), 1);
  EXPECT_DOUBLE_EQ(now.loss(), 2.5) << "a null loss keeps the last one, done's is not progress";
  EXPECT_DOUBLE_EQ(now.learning_rate(), 0.05);
  EXPECT_DOUBLE_EQ(now.samples_per_second(), 19000);
  EXPECT_EQ(now.eval_metrics().size(), 2u);
  EXPECT_DOUBLE_EQ(now.eval_metrics().at("accuracy"), 0.75);

  // Finished: its last lines come after the exit; an earlier step's do not move it back.
  ASSERT_TRUE(jobs_->Transition(name, v1::Job::RUNNING).ok());
  ASSERT_TRUE(jobs_->Transition(name, v1::Job::SUCCEEDED).ok());
  Ship(name, 1, 5, {Progress(40, 0.5, 0.025, 500, 40), Eval(40, 0.875, 0.25)});
  Ship(name, 1, 7, {Progress(30, 9.0)});
  now = progress();
  EXPECT_EQ(now.step(), 40);
  EXPECT_EQ(now.epoch(), 0);
  EXPECT_DOUBLE_EQ(now.loss(), 0.5);
  EXPECT_DOUBLE_EQ(now.learning_rate(), 0.025);
  EXPECT_DOUBLE_EQ(now.eval_metrics().at("accuracy"), 0.875);
  EXPECT_DOUBLE_EQ(now.eval_metrics().at("loss"), 0.25);
}

TEST_F(JobMetricsTest, ReshippedLinesAreAbsorbed) {
  const std::string name = NewJob();
  const std::vector<std::string> batch = {Progress(10, 2.0), Eval(10, 0.5), Progress(20, 1.0)};
  Ship(name, 1, 1, batch);
  const v1::JobMetrics once = Metrics(name);
  // The same batch again (an unacked shipment), and its lines again under later seqs (an agent
  // that lost its place): still one point per step, with the same values.
  Ship(name, 1, 1, batch);
  Ship(name, 1, 4, batch);
  const v1::JobMetrics again = Metrics(name);
  EXPECT_EQ(again.recorded_points(), 2);
  ASSERT_EQ(again.points_size(), 2);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(again.points(i).step(), once.points(i).step());
    EXPECT_EQ(again.points(i).loss(), once.points(i).loss());
    EXPECT_EQ(again.points(i).eval_metrics_size(), once.points(i).eval_metrics_size());
    EXPECT_EQ(again.points(i).time().seconds(), once.points(i).time().seconds());
  }
}

TEST(TrainerEventsTest, ParsesSkippedCheckpointRecordsOnly) {
  const std::optional<SkippedCheckpoint> skipped = ParseSkippedCheckpoint(Skipped(60, 40, 2.34));
  ASSERT_TRUE(skipped.has_value());
  EXPECT_EQ(skipped->step, 60);
  EXPECT_EQ(skipped->in_flight_step, 40);
  EXPECT_EQ(skipped->in_flight_seconds, 2.34);
  EXPECT_EQ(SkippedCheckpointMessage(*skipped),
            "checkpoint at step 60 skipped: the upload of step 40 has been going out for 2.3 s");
  for (const std::string& line :
       {Progress(60, 1.0), Eval(60, 0.5),
        std::string(R"({"event":"checkpoint_skipped","step":60})"),
        std::string("gradhub-trainer: checkpoint at step 60 skipped"), std::string("not json")}) {
    EXPECT_FALSE(ParseSkippedCheckpoint(line).has_value()) << line;
  }
  EXPECT_FALSE(ParseMetricLine(Skipped(60, 40, 2.25)).has_value()) << "not a metric point";
}

// Rank 0's checkpoint_skipped records become CHECKPOINT_SKIPPED events of the attempt: one per
// skipped step however often a batch is shipped, none from another rank or a superseded
// attempt, and no metric point.
TEST_F(JobMetricsTest, SkippedCheckpointsBecomeOneEventEach) {
  const std::string name = NewJob();
  const std::vector<std::string> batch = {Progress(50, 2.0), Skipped(60, 40, 2.5),
                                          Skipped(80, 40, 4.5), Progress(80, 1.0)};
  Ship(name, 1, 1, batch);
  Ship(name, 1, 1, batch);  // unacked, shipped again
  Ship(name, 1, 5, batch);  // and again under later seqs
  Ship(name, 1, 1, {Skipped(100, 90, 1.0)}, /*rank=*/1);
  Ship(name, 1, 1, {Skipped(100, 90, 1.0)}, /*rank=*/0, v1::LogEntry::STDERR);
  const std::vector<v1::JobEvent> events = EventsOf(name, v1::JobEvent::CHECKPOINT_SKIPPED);
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].checkpoint_step(), 60);
  EXPECT_EQ(events[0].attempt(), 1);
  EXPECT_EQ(events[0].rank(), 0);
  EXPECT_EQ(events[0].message(),
            "checkpoint at step 60 skipped: the upload of step 40 has been going out for 2.5 s");
  EXPECT_EQ(events[1].checkpoint_step(), 80);
  EXPECT_EQ(Steps(Metrics(name)), (std::vector<int64_t>{50, 80}));

  // The same step skipped again by the next attempt is its own event; the old attempt's lines,
  // shipped late, add none.
  StartAttempt(name, 2);
  Ship(name, 2, 1, {Skipped(60, 40, 1.5)});
  Ship(name, 1, 20, {Skipped(120, 100, 3.0)});
  const std::vector<v1::JobEvent> after = EventsOf(name, v1::JobEvent::CHECKPOINT_SKIPPED);
  ASSERT_EQ(after.size(), 3u);
  EXPECT_EQ(after[2].attempt(), 2);
  EXPECT_EQ(after[2].checkpoint_step(), 60);
}

TEST_F(JobMetricsTest, NewerAttemptReplacesTheStepsItTrainsAgain) {
  const std::string name = NewJob();
  Ship(name, 1, 1, {Progress(10, 3.0), Progress(20, 2.0), Progress(30, 1.0), Eval(30, 0.6)});
  StartAttempt(name, 2);
  // Attempt 1's lines that arrive after the restart are not the job's history any more.
  Ship(name, 1, 5, {Progress(40, 0.1)});
  // Attempt 2 resumed from a checkpoint of step 20: it trains 30 again, then goes on.
  Ship(name, 2, 1, {Progress(30, 1.2), Progress(40, 0.9)});
  // A late duplicate of attempt 1's step 30 does not take it back.
  Ship(name, 1, 1, {Progress(30, 1.0), Eval(30, 0.6)});

  v1::JobMetrics metrics = Metrics(name);
  ASSERT_THAT(Steps(metrics), ElementsAre(10, 20, 30, 40));
  EXPECT_EQ(metrics.points(1).attempt(), 1);
  EXPECT_DOUBLE_EQ(metrics.points(1).loss(), 2.0);
  EXPECT_EQ(metrics.points(2).attempt(), 2);
  EXPECT_DOUBLE_EQ(metrics.points(2).loss(), 1.2);
  // The older attempt's evaluation of the step went with its point, until attempt 2's own.
  EXPECT_TRUE(metrics.points(2).eval_metrics().empty());
  EXPECT_EQ(metrics.points(3).attempt(), 2);
  EXPECT_DOUBLE_EQ(metrics.points(3).loss(), 0.9);
  Ship(name, 2, 3, {Eval(30, 0.65)});
  metrics = Metrics(name);
  EXPECT_DOUBLE_EQ(metrics.points(2).eval_metrics().at("accuracy"), 0.65);
  EXPECT_DOUBLE_EQ(metrics.points(2).loss(), 1.2);
}

TEST_F(JobMetricsTest, OldProgressPointsAreThinnedEvaluationsNever) {
  const std::string name = NewJob();
  constexpr int64_t kSteps = 12000;
  int64_t seq = 1;
  for (int64_t start = 1; start <= kSteps; start += 1000) {
    std::vector<std::string> batch;
    for (int64_t step = start; step < start + 1000; ++step) {
      batch.push_back(Progress(step, 10.0 / step));
      if (step % 100 == 0) batch.push_back(Eval(step, 0.5));
    }
    Ship(name, 1, seq, batch);
    seq += static_cast<int64_t>(batch.size());
  }
  const int64_t progress_only = Count(
      "SELECT count(*)::bigint AS n FROM job_metric_points"
      " WHERE job_id = $1::uuid AND eval_metrics IS NULL",
      name);
  EXPECT_LE(progress_only, kMaxProgressPointsPerJob);
  EXPECT_GT(progress_only, kMaxProgressPointsPerJob / 2);
  EXPECT_EQ(Count("SELECT count(*)::bigint AS n FROM job_metric_points"
                  " WHERE job_id = $1::uuid AND eval_metrics IS NOT NULL",
                  name),
            kSteps / 100);
  // The first step stays, and the recent steps are all there: only old ones were thinned.
  EXPECT_EQ(Count("SELECT count(*)::bigint AS n FROM job_metric_points"
                  " WHERE job_id = $1::uuid AND step = 1",
                  name),
            1);
  EXPECT_EQ(Count("SELECT count(*)::bigint AS n FROM job_metric_points"
                  " WHERE job_id = $1::uuid AND step > 9000",
                  name),
            kSteps - 9000);
  const v1::JobMetrics metrics = Metrics(name, 0);
  EXPECT_EQ(metrics.recorded_points(), progress_only + kSteps / 100);
}

TEST_F(JobMetricsTest, DownsamplingKeepsFirstLastAndEvaluationsWithinMaxPoints) {
  const std::string name = NewJob();
  std::vector<std::string> batch;
  for (int64_t step = 1; step <= 2000; ++step) {
    batch.push_back(Progress(step, 1.0 / step));
    if (step % 100 == 0) batch.push_back(Eval(step, step / 2000.0));
  }
  Ship(name, 1, 1, batch);

  for (int32_t max_points : {100, 0, 23}) {
    SCOPED_TRACE(max_points);
    const v1::JobMetrics metrics = Metrics(name, max_points);
    const size_t limit = max_points == 0 ? 500 : static_cast<size_t>(max_points);
    EXPECT_EQ(metrics.recorded_points(), 2000);
    ASSERT_LE(static_cast<size_t>(metrics.points_size()), limit);
    // Evenly spread: close to the limit, no gap much wider than an even share of the steps.
    EXPECT_GE(static_cast<size_t>(metrics.points_size()), limit * 9 / 10);
    const std::vector<int64_t> steps = Steps(metrics);
    EXPECT_EQ(steps.front(), 1);
    EXPECT_EQ(steps.back(), 2000);
    EXPECT_TRUE(std::is_sorted(steps.begin(), steps.end()));
    EXPECT_EQ(std::set<int64_t>(steps.begin(), steps.end()).size(), steps.size());
    int evaluations = 0;
    for (size_t i = 0; i < steps.size(); ++i) {
      if (steps[i] % 100 == 0) {
        EXPECT_FALSE(metrics.points(static_cast<int>(i)).eval_metrics().empty()) << steps[i];
        ++evaluations;
      }
      if (i > 0) {
        EXPECT_LE(steps[i] - steps[i - 1], 2 * 2000 / static_cast<int64_t>(limit) + 1);
      }
    }
    EXPECT_EQ(evaluations, 20);
  }
  // Fewer points than asked for: all of them.
  EXPECT_EQ(Metrics(name, 10000).points_size(), 2000);
  // Room for fewer than the evaluations: first and last, the rest thinned by position.
  const std::vector<int64_t> few = Steps(Metrics(name, 5));
  ASSERT_EQ(few.size(), 5u);
  EXPECT_EQ(few.front(), 1);
  EXPECT_EQ(few.back(), 2000);
  EXPECT_THAT(Steps(Metrics(name, 1)), ElementsAre(2000));
}

TEST_F(JobMetricsTest, MaxPointsOutOfRangeIsInvalidArgumentNamingIt) {
  const std::string name = NewJob();
  for (int32_t max_points : {-1, 10001}) {
    v1::GetJobMetricsRequest request;
    request.set_name(name);
    request.set_max_points(max_points);
    const auto metrics = jobs_->GetJobMetrics(tenant_a_, request);
    EXPECT_EQ(metrics.status().code(), absl::StatusCode::kInvalidArgument) << max_points;
    EXPECT_THAT(metrics.status().message(), HasSubstr("max_points"));
  }
}

TEST_F(JobMetricsTest, AnotherTenantsJobIsNotFoundAndTheAdminSeesAll) {
  const std::string name = NewJob();
  Ship(name, 1, 1, {Progress(10, 1.0)});
  v1::GetJobMetricsRequest request;
  request.set_name(name);
  EXPECT_EQ(jobs_->GetJobMetrics(tenant_b_, request).status().code(), absl::StatusCode::kNotFound);
  auto admin = jobs_->GetJobMetrics(-1, request);
  ASSERT_TRUE(admin.ok()) << admin.status();
  EXPECT_EQ(admin->points_size(), 1);
  for (const std::string& missing : {std::string("jobs/00000000-0000-0000-0000-000000000000"),
                                     std::string("jobs/x'; --"), std::string("nodes/a")}) {
    request.set_name(missing);
    EXPECT_EQ(jobs_->GetJobMetrics(tenant_a_, request).status().code(), absl::StatusCode::kNotFound)
        << missing;
  }
  // A job without a history yet: no points, not an error.
  request.set_name(NewJob());
  auto empty = jobs_->GetJobMetrics(tenant_a_, request);
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(empty->points_size(), 0);
  EXPECT_EQ(empty->recorded_points(), 0);
}

// --- Without a server ---

TEST(ParseMetricLineTest, TakesProgressAndEvaluationLinesOnly) {
  auto progress = ParseMetricLine(Progress(7, 0.25, 0.01, 123.5));
  ASSERT_TRUE(progress.has_value());
  EXPECT_EQ(progress->step, 7);
  EXPECT_TRUE(progress->progress);
  EXPECT_EQ(progress->loss, 0.25);
  EXPECT_EQ(progress->learning_rate, 0.01);
  EXPECT_EQ(progress->samples_per_second, 123.5);
  EXPECT_TRUE(progress->eval_metrics.empty());

  auto eval =
      ParseMetricLine(R"({"event":"eval","step":9,"eval.top1":0.5,"eval.":1,"eval.x":"y"})");
  ASSERT_TRUE(eval.has_value());
  EXPECT_FALSE(eval->progress);
  EXPECT_FALSE(eval->loss.has_value());
  EXPECT_EQ(eval->eval_metrics, (std::map<std::string, double>{{"top1", 0.5}}));

  for (const char* line :
       {"", "step 7 loss 0.25", R"({"event":"done","step":7,"loss":0.2})",
        R"({"event":"progress","step":-1,"loss":1})", R"({"event":"progress","step":1.5})",
        R"({"event":"progress","step":"7"})", R"({"event":"progress","loss":1})",
        R"({"event":"progress","step":7,)", R"( {"event":"progress","step":7})"}) {
    EXPECT_FALSE(ParseMetricLine(line).has_value()) << line;
  }
}

std::vector<int64_t> Picked(const std::vector<int64_t>& steps, const std::vector<size_t>& indices) {
  std::vector<int64_t> out;
  for (size_t i : indices) out.push_back(steps[i]);
  return out;
}

TEST(DownsampleByStepTest, SpreadsOverStepsNotOverRows) {
  // Dense recent steps after a thinned stretch: 100 points in steps 0..9900, then 1000 in
  // 10000..10999. An even pick by step gives the old stretch its share of the step range,
  // not a tenth of the rows' share.
  std::vector<int64_t> steps;
  for (int64_t s = 0; s < 10000; s += 100) steps.push_back(s);
  for (int64_t s = 10000; s < 11000; ++s) steps.push_back(s);
  const std::vector<bool> keep(steps.size(), false);
  const std::vector<int64_t> picked = Picked(steps, DownsampleByStep(steps, keep, 50));
  ASSERT_LE(picked.size(), 50u);
  EXPECT_GE(picked.size(), 40u);
  EXPECT_EQ(picked.front(), 0);
  EXPECT_EQ(picked.back(), 10999);
  const auto old = std::count_if(picked.begin(), picked.end(), [](int64_t s) { return s < 10000; });
  EXPECT_GE(old, 35) << "the first 10,000 of 11,000 steps";
}

TEST(DownsampleByStepTest, KeepsMarkedPointsAndHandlesTinyLimits) {
  const std::vector<int64_t> steps = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  std::vector<bool> keep(10, false);
  keep[4] = keep[6] = true;
  EXPECT_THAT(Picked(steps, DownsampleByStep(steps, keep, 4)), ElementsAre(1, 5, 7, 10));
  // Room for fewer than the first, the last and the kept: evenly among those by position.
  EXPECT_THAT(Picked(steps, DownsampleByStep(steps, keep, 3)), ElementsAre(1, 5, 10));
  EXPECT_THAT(Picked(steps, DownsampleByStep(steps, keep, 2)), ElementsAre(1, 10));
  EXPECT_THAT(Picked(steps, DownsampleByStep(steps, keep, 1)), ElementsAre(10));
  EXPECT_EQ(DownsampleByStep(steps, keep, 10).size(), 10u);
  EXPECT_TRUE(DownsampleByStep({}, {}, 5).empty());
  EXPECT_THAT(Picked({42}, DownsampleByStep({42}, {true}, 1)), ElementsAre(42));
}

}  // namespace
}  // namespace gradhub::api
