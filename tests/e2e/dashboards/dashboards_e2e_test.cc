// Both Grafana dashboards against the whole local cluster and a real Prometheus: PostgreSQL,
// gradhub-api, gradhub-metrics, gradhub-checkpoint, two agents (tests/support/local_cluster.h),
// a real world-2 data-parallel training job and a real two-stage pipeline job. Every PromQL
// expression of every panel, template variables filled in as Grafana would, must return data
// for the job it is about (the Pipeline row's for the pipeline job, the others for the
// data-parallel one, which has no pipeline series); a failure names the panels.
//
// The cluster is started once for the suite, in this order:
//   1. PostgreSQL, gradhub-api (migrates), a tenant and a node token;
//   2. gradhub-metrics and gradhub-checkpoint on the api's database;
//   3. agents a and b, two slots each: each job puts one rank on each, so the data-parallel
//      job's two ranks allreduce across "nodes" and the pipeline's stages talk across them;
//   4. Prometheus scraping the api's REST port, gradhub-metrics and gradhub-checkpoint;
//   5. the data-parallel job, until it has trained, evaluated and checkpointed for a while and
//      Prometheus has its training series; one failing API call, so the errors panel has
//      something;
//   6. the pipeline job (parallelism: 2 stages, 4 micro-batches), until Prometheus has its
//      pipeline series.
// The jobs are still running when the panels are asked, and cancelled at the end.
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

// The queries of the Pipeline row: only a pipeline job's ranks have the series they ask.
bool AsksPipelineSeries(const testing::PanelQuery& query) {
  return query.expr.find("gradhub_pipeline_") != std::string::npos;
}

std::vector<testing::PanelQuery> QueriesWhere(const std::vector<testing::PanelQuery>& queries,
                                              bool pipeline) {
  std::vector<testing::PanelQuery> kept;
  for (const auto& query : queries) {
    if (AsksPipelineSeries(query) == pipeline) kept.push_back(query);
  }
  return kept;
}

struct Cluster {
  std::unique_ptr<testing::LocalCluster> local;
  std::unique_ptr<testing::PrometheusServer> prometheus;
  std::string job, pipeline_job;
  std::string error;           // why the cluster is not ready; empty when it is
  std::string pipeline_error;  // why the pipeline job did not run; empty when it did

  // Steps 1-3.
  bool StartServices() {
    testing::LocalClusterOptions options;
    options.slots = 2;
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

  // Creates a job on synthetic data, world size 2 with one rank per node, whose model and
  // anything else come from `extra`, into *name; waits until it has run 100 steps. Returns
  // why it did not; empty when it did.
  std::string StartJob(const std::string& extra, std::string* name) {
    v1::CreateJobRequest request;
    *request.mutable_spec() = ParseJobSpec(
        "dataset: {synthetic: {numSamples: 4096, numFeatures: 32, numClasses: 4, noise: 0.5},"
        " validationFraction: 0.1}\n"
        "optimizer: {sgd: {lr: 0.05, momentum: 0.9}}\n"
        "batchSizePerRank: 16\nmaxSteps: 1000000\nlogEverySteps: 10\nevalEverySteps: 20\n"
        "distributed: {worldSize: 2, ranksPerNode: 1}\nhangTimeoutSeconds: 60\n" +
        extra);
    v1::Job created;
    const grpc::Status status =
        local->jobs().CreateJob(local->TenantContext().get(), request, &created);
    if (!status.ok()) return "CreateJob: " + status.error_message();
    *name = created.name();
    const v1::Job seen = local->AwaitJob(*name, [](const v1::Job& j) {
      return testing::Ended(j) || (j.state() == v1::Job::RUNNING && j.progress().step() >= 100);
    });
    if (seen.state() != v1::Job::RUNNING) return "job " + *name + " is " + seen.ShortDebugString();
    return "";
  }

  // Step 5. Returns false only when the job itself did not run; missing telemetry is left for
  // the panels to report.
  bool RunJob() {
    const std::string why =
        StartJob("model: {mlp: {layers: [32, 64, 4]}}\ncheckpoint: {everySteps: 25}\n", &job);
    if (!why.empty()) return Fail(why);
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

  // Step 6: a pipeline of two stages, one replica (no allreduce: that is the other job's).
  void RunPipelineJob() {
    pipeline_error = StartJob(
        "model: {mlp: {layers: [32, 64, 64, 4]}}\n"
        "parallelism: {pipelineStages: 2, microBatches: 4, schedule: ONE_F_ONE_B}\n",
        &pipeline_job);
    if (!pipeline_error.empty()) return;
    const std::string id = pipeline_job.substr(5);
    prometheus->AwaitData("gradhub_pipeline_bubble_fraction{job_id=\"" + id + "\"}", seconds(60));
    std::this_thread::sleep_for(seconds(5));  // a few scrapes, for the rates
  }

  void CancelJobs() {
    for (const std::string* name : {&job, &pipeline_job}) {
      if (!name->empty()) local->Cancel(*name);
    }
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
    if (cluster_->StartServices() && cluster_->StartPrometheus() && cluster_->RunJob()) {
      cluster_->RunPipelineJob();
    }
  }
  static void TearDownTestSuite() {
    cluster_->CancelJobs();
    delete cluster_;
    cluster_ = nullptr;
  }

  // The panels of `file` without data for `job`: those of the Pipeline row when `pipeline`,
  // the others when not.
  static std::vector<std::string> PanelsWithoutData(const std::string& file, const std::string& job,
                                                    bool pipeline) {
    const std::vector<testing::PanelQuery> queries =
        QueriesWhere(testing::DashboardQueries(SourcePath(file)), pipeline);
    EXPECT_GE(queries.size(), pipeline ? 4u : 20u) << file << ": the dashboard lost its panels";
    return testing::PanelsWithoutData(*cluster_->prometheus, queries,
                                      {{"job_id", job.substr(job.empty() ? 0 : 5)},
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
  const auto failures =
      PanelsWithoutData("dashboard/dashboards/platform-overview.json", cluster_->job, false);
  EXPECT_TRUE(failures.empty()) << "platform overview: panels without data:\n"
                                << absl::StrJoin(failures, "\n");
}

TEST_F(DashboardsE2eTest, TrainingJobPanelsAllHaveData) {
  ASSERT_TRUE(cluster_->error.empty()) << cluster_->error;
  const auto failures =
      PanelsWithoutData("dashboard/dashboards/training-job.json", cluster_->job, false);
  EXPECT_TRUE(failures.empty()) << "training job " << cluster_->job << ": panels without data:\n"
                                << absl::StrJoin(failures, "\n");
}

TEST_F(DashboardsE2eTest, TrainingJobPipelinePanelsHaveDataForAPipelineJob) {
  ASSERT_TRUE(cluster_->error.empty()) << cluster_->error;
  ASSERT_TRUE(cluster_->pipeline_error.empty()) << cluster_->pipeline_error;
  const auto failures =
      PanelsWithoutData("dashboard/dashboards/training-job.json", cluster_->pipeline_job, true);
  EXPECT_TRUE(failures.empty()) << "pipeline job " << cluster_->pipeline_job
                                << ": panels without data:\n"
                                << absl::StrJoin(failures, "\n");
}

}  // namespace
}  // namespace gradhub
