// The CLI's renderings that need no server: `watch`'s progress bar and time left, and
// `metrics`' table and loss plot.
#include "services/cli/output.h"

#include <gmock/gmock.h>
#include <google/protobuf/util/time_util.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "services/common/contract/job_spec.h"

namespace gradhub::cli {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

std::vector<std::string> Lines(const std::string& text) {
  return absl::StrSplit(text, '\n', absl::SkipEmpty());
}

// A running job at `step` of 1000, 64 x 2 x 1 samples per step, at `samples_per_second`.
v1::Job Running(int64_t step, double samples_per_second) {
  v1::Job job;
  job.set_state(v1::Job::RUNNING);
  job.mutable_spec()->set_batch_size_per_rank(64);
  job.mutable_spec()->mutable_distributed()->set_world_size(2);
  job.mutable_spec()->set_grad_accumulation_steps(1);
  job.mutable_spec()->set_max_steps(5000);  // the trainer's total below wins over it
  job.mutable_progress()->set_step(step);
  job.mutable_progress()->set_total_steps(1000);
  job.mutable_progress()->set_loss(0.5);
  job.mutable_progress()->set_samples_per_second(samples_per_second);
  *job.mutable_progress()->mutable_last_report_time() =
      google::protobuf::util::TimeUtil::SecondsToTimestamp(1700000000);
  return job;
}

TEST(PlainNumberTest, FixedNotationWithFourSignificantDigits) {
  EXPECT_EQ(PlainNumber(18750.3), "18750") << "the integer part is never rounded away";
  EXPECT_EQ(PlainNumber(1234567.8), "1234568");
  EXPECT_EQ(PlainNumber(0.123456), "0.1235");
  EXPECT_EQ(PlainNumber(2.34567), "2.346");
  EXPECT_EQ(PlainNumber(0.000025), "0.000025");
  EXPECT_EQ(PlainNumber(0.0001234567), "0.0001235");
  EXPECT_EQ(PlainNumber(3e-7), "0.0000003");
  EXPECT_EQ(PlainNumber(2.0), "2");
  EXPECT_EQ(PlainNumber(0.5), "0.5");
  EXPECT_EQ(PlainNumber(-0.25), "-0.25");
  EXPECT_EQ(PlainNumber(0.0), "0");
  EXPECT_EQ(PlainNumber(-0.0), "0");
  EXPECT_EQ(PlainNumber(65536), "65536");
  // Rounding that carries into the next power of ten.
  EXPECT_EQ(PlainNumber(9.99996), "10");
  EXPECT_EQ(PlainNumber(0.099999), "0.1");
  EXPECT_EQ(PlainNumber(1.23456, 2), "1.2");
  // Beyond what training reports: scientific, and the non-finite values by name.
  EXPECT_EQ(PlainNumber(1e-12), "1e-12");
  EXPECT_EQ(PlainNumber(3e20), "3e+20");
  EXPECT_EQ(PlainNumber(std::nan("")), "nan");
  EXPECT_EQ(PlainNumber(-HUGE_VAL), "-inf");
}

TEST(PlainNumberTest, ExactNumberReadsBackAsTheSameValue) {
  EXPECT_EQ(ExactNumber(0.00003), "0.00003");
  EXPECT_EQ(ExactNumber(0.1), "0.1");
  EXPECT_EQ(ExactNumber(18750.0), "18750");
  EXPECT_EQ(ExactNumber(1e-8), "0.00000001");
  EXPECT_EQ(ExactNumber(0.1f), "0.1") << "a float's own shortest digits";
  EXPECT_EQ(ExactNumber(1.0 / 3), "0.3333333333333333");
  EXPECT_EQ(ExactNumber(1e-300), "1e-300");
}

// The JobSpec rendered for `describe` keeps its numbers plain and parses back to itself.
TEST(ToYamlTest, NumbersArePlainAndReadBack) {
  v1::JobSpec spec;
  spec.mutable_optimizer()->mutable_adam()->set_lr(0.00003);
  spec.mutable_optimizer()->mutable_adam()->set_eps(1e-8);
  spec.mutable_model()->mutable_mlp()->set_dropout(0.1f);
  const std::string yaml = ToYaml(spec);
  EXPECT_THAT(yaml, HasSubstr("lr: 0.00003"));
  EXPECT_THAT(yaml, HasSubstr("eps: 0.00000001"));
  EXPECT_THAT(yaml, HasSubstr("dropout: 0.1"));
  EXPECT_THAT(yaml, Not(HasSubstr("e-")));
  const v1::JobSpec parsed = ParseJobSpec(yaml);
  EXPECT_EQ(parsed.optimizer().adam().lr(), 0.00003);
  EXPECT_EQ(parsed.optimizer().adam().eps(), 1e-8);
  EXPECT_EQ(parsed.model().mlp().dropout(), 0.1f);
}

// `watch` on a pipe, `get` and `metrics`: the numbers a user sees are plain.
TEST(PlainNumberTest, EveryProgressViewPrintsPlainNumbers) {
  v1::Job job = Running(400, 18750);
  job.mutable_progress()->set_learning_rate(0.00003);
  job.mutable_progress()->set_epoch(2);
  EXPECT_EQ(ProgressLine(job), "RUNNING 400/1000 loss=0.5 samples/s=18750");
  EXPECT_THAT(JobSummary(job),
              HasSubstr("400/1000 steps, epoch 2, loss 0.5, 18750 samples/s, lr 0.00003"));
  v1::JobMetrics metrics;
  v1::JobMetricPoint* point = metrics.add_points();
  point->set_step(1);
  point->set_loss(123456.7);
  point->set_learning_rate(0.00003);
  point->set_samples_per_second(18750);
  EXPECT_THAT(Lines(MetricsTable(metrics))[1],
              testing::MatchesRegex("1 +0 +123457 +0.00003 +18750 +-"));
  EXPECT_THAT(LossPlot(metrics, 10, 3), HasSubstr("123457 |*"));
}

TEST(FormatDurationTest, TwoUnitsAtMost) {
  EXPECT_EQ(ShortDuration(absl::ZeroDuration()), "0s");
  EXPECT_EQ(ShortDuration(absl::Seconds(45.9)), "45s");
  EXPECT_EQ(ShortDuration(absl::Seconds(125)), "2m05s");
  EXPECT_EQ(ShortDuration(absl::Seconds(3720)), "1h02m");
  EXPECT_EQ(ShortDuration(absl::Hours(76)), "3d04h");
  EXPECT_EQ(ShortDuration(absl::Seconds(-3)), "0s");
}

TEST(TimeLeftTest, StepsToGoAtTheReportedThroughput) {
  // 600 steps x 128 samples at 1280 samples/s.
  EXPECT_EQ(TimeLeft(Running(400, 1280)), absl::Seconds(60));
  v1::Job accumulating = Running(400, 1280);
  accumulating.mutable_spec()->set_grad_accumulation_steps(4);
  EXPECT_EQ(TimeLeft(accumulating), absl::Seconds(240));
  // A pipeline's 2 ranks are 2 stages of 1 replica: 64 samples a step, half the time.
  v1::Job pipelined = Running(400, 1280);
  pipelined.mutable_spec()->mutable_parallelism()->set_pipeline_stages(2);
  EXPECT_EQ(TimeLeft(pipelined), absl::Seconds(30));
  // Without the trainer's total, the spec's max_steps.
  v1::Job no_total = Running(400, 1280);
  no_total.mutable_progress()->set_total_steps(0);
  EXPECT_EQ(TimeLeft(no_total), absl::Seconds(4600 * 128 / 1280));

  EXPECT_EQ(TimeLeft(Running(400, 0)), std::nullopt) << "no throughput";
  v1::Job unreported = Running(0, 0);
  unreported.mutable_progress()->clear_last_report_time();
  EXPECT_EQ(TimeLeft(unreported), std::nullopt);
  v1::Job done = Running(1000, 1280);
  done.set_state(v1::Job::SUCCEEDED);
  EXPECT_EQ(TimeLeft(done), std::nullopt);
  v1::Job unbounded = Running(400, 1280);
  unbounded.mutable_progress()->set_total_steps(0);
  unbounded.mutable_spec()->set_max_steps(0);
  EXPECT_EQ(TimeLeft(unbounded), std::nullopt);
}

TEST(ProgressBarTest, ShowsBarPercentAndTimeLeft) {
  EXPECT_EQ(ProgressBar(Running(400, 1280), 10),
            "[####------]  40% ETA 1m00s RUNNING 400/1000 loss=0.5 samples/s=1280");
  // Unknown time left while running; none once ended.
  EXPECT_THAT(ProgressBar(Running(400, 0), 10), StartsWith("[####------]  40% ETA ? RUNNING"));
  v1::Job done = Running(1000, 1280);
  done.set_state(v1::Job::SUCCEEDED);
  EXPECT_EQ(ProgressBar(done, 10), "[##########] 100% SUCCEEDED 1000/1000 loss=0.5 samples/s=1280");
  // No total at all: the plain line.
  v1::Job unbounded = Running(400, 1280);
  unbounded.mutable_progress()->set_total_steps(0);
  unbounded.mutable_spec()->set_max_steps(0);
  EXPECT_EQ(ProgressBar(unbounded, 10), ProgressLine(unbounded));
}

v1::JobMetrics History() {
  v1::JobMetrics metrics;
  metrics.set_name("jobs/x");
  for (int64_t step = 10; step <= 100; step += 10) {
    v1::JobMetricPoint& point = *metrics.add_points();
    point.set_step(step);
    point.set_attempt(step > 50 ? 2 : 1);
    point.set_loss(10.0 / step);
    point.set_learning_rate(0.1);
    point.set_samples_per_second(1500);
  }
  (*metrics.mutable_points(4)->mutable_eval_metrics())["loss"] = 0.25;
  (*metrics.mutable_points(4)->mutable_eval_metrics())["accuracy"] = 0.875;
  metrics.mutable_points(9)->clear_loss();  // an evaluation-only point
  metrics.mutable_points(9)->clear_learning_rate();
  metrics.mutable_points(9)->clear_samples_per_second();
  (*metrics.mutable_points(9)->mutable_eval_metrics())["accuracy"] = 0.9;
  metrics.set_recorded_points(10);
  return metrics;
}

TEST(MetricsTableTest, OneRowPerPointWithEvaluationsByName) {
  const std::vector<std::string> rows = Lines(MetricsTable(History()));
  ASSERT_EQ(rows.size(), 11u);
  EXPECT_THAT(rows[0], testing::MatchesRegex("STEP +ATTEMPT +LOSS +LR +SAMPLES/S +EVAL"));
  EXPECT_THAT(rows[1], testing::MatchesRegex("10 +1 +1 +0.1 +1500 +-"));
  EXPECT_THAT(rows[5], testing::MatchesRegex("50 +1 +0.2 +0.1 +1500 +accuracy=0.875 loss=0.25"));
  EXPECT_THAT(rows[10], testing::MatchesRegex("100 +2 +- +- +- +accuracy=0.9"));
  EXPECT_EQ(Lines(MetricsTable(v1::JobMetrics())).size(), 1u) << "the header alone";
}

TEST(LossPlotTest, PlotsLossAgainstStepInTheGivenCells) {
  const std::string plot = LossPlot(History(), 20, 5);
  const std::vector<std::string> lines = Lines(plot);
  // Title, 5 rows, the axis, the step labels.
  ASSERT_EQ(lines.size(), 8u) << plot;
  EXPECT_EQ(lines[0], "loss by step");
  // Loss 1 (step 10) top left, 1/9 (step 90) bottom right; step 100 has no loss, so the
  // last column is step 90's. Labels: the loss of the top, middle and bottom rows.
  EXPECT_EQ(lines[1], "     1 |*");
  EXPECT_EQ(lines[2], "       |");
  EXPECT_EQ(lines[3], "0.5556 |  *");
  EXPECT_EQ(lines[4], "       |     * *");
  EXPECT_EQ(lines[5], "0.1111 |          * * *  * *");
  EXPECT_EQ(lines[6], "       +--------------------");
  EXPECT_EQ(lines[7], "        10                90 step");
  for (const std::string& line : lines) EXPECT_LE(line.size(), 6u + 2 + 20 + 5) << line;
}

TEST(LossPlotTest, EdgeCases) {
  EXPECT_EQ(LossPlot(v1::JobMetrics()), "");
  v1::JobMetrics evaluations_only;
  (*evaluations_only.add_points()->mutable_eval_metrics())["accuracy"] = 0.5;
  EXPECT_EQ(LossPlot(evaluations_only), "");

  // A flat loss: the middle row, its one label there; default size 60 x 15.
  v1::JobMetrics flat;
  for (int64_t step : {5, 6, 7}) {
    flat.add_points()->set_step(step);
    flat.mutable_points(flat.points_size() - 1)->set_loss(2.0);
  }
  const std::vector<std::string> lines = Lines(LossPlot(flat));
  ASSERT_EQ(lines.size(), 1u + 15 + 2);
  EXPECT_EQ(lines[8], "2 |*" + std::string(29, ' ') + "*" + std::string(28, ' ') + "*");
  EXPECT_EQ(lines[16], "  +" + std::string(60, '-'));
  EXPECT_THAT(lines[17], HasSubstr("5"));
  EXPECT_THAT(lines[17], HasSubstr("7 step"));
  v1::JobMetrics single;
  single.add_points()->set_step(3);
  single.mutable_points(0)->set_loss(0.5);
  const std::string one = LossPlot(single, 10, 3);
  EXPECT_THAT(Lines(one), ElementsAre("loss by step", "    |", "0.5 |*", "    |", "    +----------",
                                      "     3 step"));
  EXPECT_THAT(one, Not(HasSubstr("nan")));
}

// `describe`'s checkpoint line: the highest committed step that no CHECKPOINT_CORRUPT took back.
TEST(LatestCheckpointTest, HighestCommittedStepNotMarkedBad) {
  auto event = [](v1::JobEvent::Type type, int64_t step, int64_t bytes) {
    v1::JobEvent e;
    e.set_type(type);
    e.set_attempt(1);
    e.set_checkpoint_step(step);
    e.set_checkpoint_size_bytes(bytes);
    return e;
  };
  const v1::JobEvent c25 = event(v1::JobEvent::CHECKPOINT_COMMITTED, 25, 2048);
  const v1::JobEvent c50 = event(v1::JobEvent::CHECKPOINT_COMMITTED, 50, 3 << 20);
  const v1::JobEvent bad50 = event(v1::JobEvent::CHECKPOINT_CORRUPT, 50, 0);
  const v1::JobEvent state = event(v1::JobEvent::STATE_CHANGED, 0, 0);
  EXPECT_EQ(LatestCheckpoint({}), nullptr);
  EXPECT_EQ(LatestCheckpoint({&state}), nullptr);
  EXPECT_EQ(LatestCheckpoint({&c50, &c25, &state}), &c50);
  EXPECT_EQ(LatestCheckpoint({&c25, &c50, &bad50}), &c25);
  EXPECT_EQ(CheckpointSummary(nullptr), "none committed");
  EXPECT_THAT(CheckpointSummary(&c50), HasSubstr("step 50, 3.0 MiB (attempt 1, committed "));
}

}  // namespace
}  // namespace gradhub::cli
