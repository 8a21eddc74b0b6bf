// The monitoring configuration against the real tools: promtool accepts deploy/prometheus.yml
// and lints what gradhub-metrics exposes; every panel of the training dashboard, asked of a real
// Prometheus that scrapes a real gradhub-metrics fed with a world-2 job's synthetic telemetry,
// has data. (tests/e2e/dashboards does the same for both dashboards with real training.)
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "absl/strings/str_join.h"
#include "gpu_worker/telemetry_client/telemetry_reporter.h"
#include "tests/integration/metrics/metrics_test_util.h"
#include "tests/support/grafana_dashboard.h"
#include "tests/support/prometheus_server.h"

namespace gradhub::metrics {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using Clock = std::chrono::steady_clock;

constexpr char kPromtool[] = "/usr/bin/promtool";

std::string SourcePath(const std::string& relative) {
  const char* root = std::getenv("GRADHUB_SOURCE_DIR");
  return std::string(root != nullptr ? root : ".") + "/" + relative;
}

const char* kDashboards[] = {"dashboard/dashboards/platform-overview.json",
                             "dashboard/dashboards/training-job.json"};

TEST(MonitoringConfigTest, PromtoolAcceptsDeployPrometheusYml) {
  ASSERT_EQ(access(kPromtool, X_OK), 0)
      << "promtool missing: install Debian's prometheus (make setup)";
  const auto result =
      testing::Run({kPromtool, "check", "config", SourcePath("deploy/prometheus.yml")});
  EXPECT_EQ(result.exit_code, 0) << result.out << result.err;
}

TEST(MonitoringConfigTest, EveryPanelQueriesPrometheusThroughTheDatasourceVariable) {
  for (const char* file : kDashboards) {
    const std::string path = SourcePath(file);
    std::ifstream in(path);
    const nlohmann::json dashboard = nlohmann::json::parse(in, nullptr, false);
    ASSERT_FALSE(dashboard.is_discarded()) << path << " is not JSON";
    EXPECT_FALSE(dashboard.value("uid", "").empty()) << path;
    EXPECT_THAT(testing::DashboardVariables(path), ::testing::Contains("datasource")) << path;
    for (const auto& panel : dashboard["panels"]) {
      if (panel.value("type", "") == "row") continue;
      const std::string title = panel.value("title", "");
      ASSERT_TRUE(panel.contains("targets") && !panel["targets"].empty()) << path << ": " << title;
      for (const auto& target : panel["targets"]) {
        EXPECT_FALSE(target.value("expr", "").empty()) << path << ": " << title;
        EXPECT_EQ(target["datasource"].value("uid", ""), "${datasource}") << path << ": " << title;
      }
    }
  }
  for (const char* file : {"dashboard/provisioning/datasources/prometheus.yml",
                           "dashboard/provisioning/dashboards/gradhub.yml"}) {
    EXPECT_TRUE(std::ifstream(SourcePath(file)).good()) << file;
  }
}

// Two ranks of a job reporting like trainers, with evaluations and checkpoints now and then,
// and every field a trainer may send: the pipeline's too, each rank as one stage (as a job of
// two stages would), so that the Pipeline row's panels are asked as well.
class SyntheticJob {
 public:
  SyntheticJob(const std::string& address, const std::string& token, const std::string& job) {
    for (int rank = 0; rank < 2; ++rank) {
      telemetry_client::TelemetryReporterOptions options;
      options.address = address;
      options.token = token;
      options.job = job;
      options.rank = rank;
      options.batch_steps = 4;
      options.batch_interval = milliseconds(100);
      reporters_.push_back(std::make_unique<telemetry_client::TelemetryReporter>(options));
    }
    thread_ = std::thread([this] { Run(); });
  }
  ~SyntheticJob() {
    stop_ = true;
    thread_.join();
    for (auto& reporter : reporters_) reporter->Close(Clock::now() + seconds(5));
  }

 private:
  void Run() {
    for (int64_t step = 1; !stop_; ++step) {
      for (int rank = 0; rank < 2; ++rank) {
        telemetry_client::StepFigures s;
        s.step = step;
        s.loss = 2.0 / (1 + 0.01 * static_cast<double>(step)) + 0.01 * rank;
        s.learning_rate = 0.05;
        s.samples = 32;
        s.samples_per_second = 3200;
        s.forward_seconds = 0.002;
        s.backward_seconds = 0.004 + 0.001 * rank;
        s.allreduce_wait_seconds = 0.001;
        s.optimizer_seconds = 0.001;
        s.step_seconds = 0.010 + 0.001 * rank;
        s.allreduce_bytes = 1 << 20;
        s.allreduce_seconds = 0.002;
        s.bus_bandwidth_bytes_per_second = 5.2e8;
        s.buckets = 2;
        if (step % 20 == 0) s.eval_metrics["accuracy"] = 0.5 + 0.001 * static_cast<double>(step);
        if (rank == 0 && step % 25 == 0) s.checkpoint_save_seconds = 0.05;
        s.pipeline_stage = rank;
        s.p2p_bytes = 2 << 20;
        s.p2p_wait_seconds = 0.002 - 0.001 * rank;
        s.bubble_fraction = 0.2 - 0.1 * rank;
        s.peak_activation_bytes = (2 - rank) << 20;
        reporters_[rank]->Report(s);
      }
      std::this_thread::sleep_for(milliseconds(10));
    }
  }
  std::vector<std::unique_ptr<telemetry_client::TelemetryReporter>> reporters_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

class TrainingDashboardTest : public MetricsDatabaseTest {};

TEST_F(TrainingDashboardTest, EveryPanelHasDataFromARealPrometheus) {
  ASSERT_TRUE(testing::PrometheusServer::Available())
      << "prometheus missing: install Debian's prometheus (make setup)";
  MetricsProcess metrics(url_);
  ASSERT_TRUE(metrics.Start());
  const std::string job = InsertJob(2);
  testing::PrometheusServer prometheus(
      {{{"gradhub-metrics", "127.0.0.1:" + std::to_string(metrics.http_port())}}});
  ASSERT_TRUE(prometheus.AwaitTargetsUp(seconds(30))) << prometheus.log();
  SyntheticJob training(metrics.address(), kAdminToken, job);
  // Long enough for rates over a few scrapes and for evaluations and checkpoints to land.
  const std::string id = job.substr(5);
  ASSERT_GT(prometheus.AwaitData("gradhub_eval_metric{job_id=\"" + id + "\"}", seconds(30))
                .finite_samples,
            0u);
  std::this_thread::sleep_for(seconds(5));
  const auto failures =
      testing::PanelsWithoutData(prometheus, testing::DashboardQueries(SourcePath(kDashboards[1])),
                                 {{"job_id", id},
                                  {"datasource", "prometheus"},
                                  {"__rate_interval", "1m"},
                                  {"__interval", "1s"},
                                  {"__range", "5m"}});
  EXPECT_TRUE(failures.empty()) << "panels without data:\n" << absl::StrJoin(failures, "\n");
}

// What gradhub-metrics exposes passes promtool's lint of Prometheus' naming conventions
// (units as suffixes, _total on counters and only there, ...).
TEST_F(TrainingDashboardTest, ExpositionPassesPromtoolLint) {
  ASSERT_EQ(access(kPromtool, X_OK), 0)
      << "promtool missing: install Debian's prometheus (make setup)";
  MetricsProcess metrics(url_);
  ASSERT_TRUE(metrics.Start());
  const std::string job = InsertJob(2);
  {
    SyntheticJob training(metrics.address(), kAdminToken, job);
    std::this_thread::sleep_for(milliseconds(1500));
  }
  testing::TempDir dir;
  const std::string file = dir.path() + "/exposition.txt";
  std::ofstream(file) << metrics.Scrape();
  const auto lint =
      testing::Run({"/bin/sh", "-c", std::string(kPromtool) + " check metrics < " + file});
  EXPECT_EQ(lint.exit_code, 0) << lint.out << lint.err;
  EXPECT_EQ(lint.out + lint.err, "") << "promtool's lint";
}

}  // namespace
}  // namespace gradhub::metrics
