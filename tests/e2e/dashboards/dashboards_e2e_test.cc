// Both Grafana dashboards against the whole local cluster and a real Prometheus: PostgreSQL,
// gradhub-api, gradhub-metrics, gradhub-checkpoint, two agents (tests/support/local_cluster.h),
// and a real world-2 training job. Every PromQL expression of every panel,
// template variables filled in as Grafana would, must return data; a failure names the panels.
//
// The cluster is started once for the suite, in this order:
//   1. PostgreSQL, gradhub-api (migrates), a tenant and a node token;
//   2. gradhub-metrics and gradhub-checkpoint on the api's database;
//   3. agents a and b, one slot each, so the job's two ranks allreduce across "nodes";
//   4. Prometheus scraping the api's REST port, gradhub-metrics and gradhub-checkpoint;
//   5. the job, until it has trained, evaluated and checkpointed for a while and Prometheus
//      has its training series; one failing API call, so the errors panel has something.
// The job is still running when the panels are asked, and cancelled at the end.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <memory>
#include <regex>
#include <thread>

#include "absl/strings/str_join.h"
#include "gradhub/v1/jobs.grpc.pb.h"
#include "services/common/contract/job_spec.h"
#include "tests/support/grafana_dashboard.h"
#include "tests/support/local_cluster.h"
#include "tests/support/prometheus_server.h"

namespace gradhub {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using Clock = std::chrono::steady_clock;

std::string SourcePath(const std::string& relative) {
  const char* root = std::getenv("GRADHUB_SOURCE_DIR");
  return std::string(root != nullptr ? root : ".") + "/" + relative;
}

struct Cluster {
  std::unique_ptr<testing::LocalCluster> local;
  std::unique_ptr<testing::PrometheusServer> prometheus;
  std::string job;
  std::string error;  // why the cluster is not ready; empty when it is

  // Steps 1-3: one slot per agent, so the job's two ranks allreduce across "nodes".
  bool StartServices() {
    testing::LocalClusterOptions options;
    options.slots = 1;
    options.checkpoint_service = true;
    options.metrics_service = true;
    local = std::make_unique<testing::LocalCluster>(options);
    return local->Start() || Fail("the local cluster did not start");
  }

  // Step 4.
  bool StartPrometheus() {
    const auto at = [](int port) { return "127.0.0.1:" + std::to_string(port); };
    std::vector<testing::ScrapeTarget> targets = {
        {"gradhub-api", at(local->api_http_port())},
        {"gradhub-metrics", at(local->metrics_http_port())},
        {"gradhub-checkpoint", at(local->checkpoint_http_port())}};
    prometheus =
        std::make_unique<testing::PrometheusServer>(testing::PrometheusServerOptions{targets});
    if (!prometheus->AwaitTargetsUp(seconds(30)))
      return Fail("targets not up: " + prometheus->log());
    return true;
  }

  // Step 5. Returns false only when the job itself did not run; missing telemetry is left for
  // the panels to report.
  bool RunJob() {
    v1::CreateJobRequest request;
    *request.mutable_spec() = ParseJobSpec(
        "model: {mlp: {layers: [32, 64, 4]}}\n"
        "dataset: {synthetic: {numSamples: 4096, numFeatures: 32, numClasses: 4, noise: 0.5},"
        " validationFraction: 0.1}\n"
        "optimizer: {sgd: {lr: 0.05, momentum: 0.9}}\n"
        "batchSizePerRank: 16\nmaxSteps: 1000000\nlogEverySteps: 10\nevalEverySteps: 20\n"
        "checkpoint: {everySteps: 25}\n"
        "distributed: {worldSize: 2, ranksPerNode: 1}\nhangTimeoutSeconds: 60\n");
    v1::Job created;
    const grpc::Status status =
        local->jobs().CreateJob(local->TenantContext().get(), request, &created);
    if (!status.ok()) return Fail("CreateJob: " + status.error_message());
    job = created.name();
    const v1::Job seen = local->AwaitJob(job, [](const v1::Job& j) {
      return testing::Ended(j) || (j.state() == v1::Job::RUNNING && j.progress().step() >= 100);
    });
    if (seen.state() != v1::Job::RUNNING)
      return Fail("job " + job + " is " + seen.ShortDebugString());
    const std::string id = job.substr(5);
    // Whatever the trainer sends: wait for it, but do not fail here (the panels will).
    prometheus->AwaitData("gradhub_eval_metric{job_id=\"" + id + "\"}", seconds(60));
    prometheus->AwaitData("gradhub_checkpoint_save_seconds_count{job_id=\"" + id + "\"} > 0",
                          seconds(30));
    v1::GetJobRequest missing;
    missing.set_name("jobs/00000000-0000-4000-8000-000000000000");
    v1::Job none;
    local->jobs().GetJob(local->TenantContext().get(), missing, &none);  // NOT_FOUND, on purpose
    std::this_thread::sleep_for(seconds(5));  // a few scrapes after all of it
    return true;
  }

  void CancelJob() {
    if (!job.empty()) local->Cancel(job);
  }

  bool Fail(const std::string& why) {
    error = why;
    return false;
  }
};

class DashboardsE2eTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    cluster_ = new Cluster;
    if (!testing::PrometheusServer::Available()) {
      cluster_->error = "prometheus missing: install Debian's prometheus (make setup)";
      return;
    }
    cluster_->StartServices() && cluster_->StartPrometheus() && cluster_->RunJob();
  }
  static void TearDownTestSuite() {
    cluster_->CancelJob();
    delete cluster_;
    cluster_ = nullptr;
  }

  // The panels of `file` without data.
  static std::vector<std::string> PanelsWithoutData(const std::string& file) {
    const std::vector<testing::PanelQuery> queries = testing::DashboardQueries(SourcePath(file));
    EXPECT_GE(queries.size(), 20u) << file << ": the dashboard lost its panels";
    return testing::PanelsWithoutData(
        *cluster_->prometheus, queries,
        {{"job_id", cluster_->job.substr(cluster_->job.empty() ? 0 : 5)},
         {"datasource", "prometheus"},
         {"__rate_interval", "5m"},
         {"__interval", "1s"},
         {"__range", "10m"}});
  }

  static Cluster* cluster_;
};

Cluster* DashboardsE2eTest::cluster_ = nullptr;

TEST_F(DashboardsE2eTest, PlatformOverviewPanelsAllHaveData) {
  ASSERT_TRUE(cluster_->error.empty()) << cluster_->error;
  const auto failures = PanelsWithoutData("dashboard/dashboards/platform-overview.json");
  EXPECT_TRUE(failures.empty()) << "platform overview: panels without data:\n"
                                << absl::StrJoin(failures, "\n");
}

TEST_F(DashboardsE2eTest, TrainingJobPanelsAllHaveData) {
  ASSERT_TRUE(cluster_->error.empty()) << cluster_->error;
  const auto failures = PanelsWithoutData("dashboard/dashboards/training-job.json");
  EXPECT_TRUE(failures.empty()) << "training job " << cluster_->job << ": panels without data:\n"
                                << absl::StrJoin(failures, "\n");
}

}  // namespace
}  // namespace gradhub
