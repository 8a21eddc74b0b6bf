// Both Grafana dashboards against the whole local cluster and a real Prometheus: PostgreSQL,
// gradhub-api, gradhub-metrics, gradhub-checkpoint (when built), two agents given
// --metrics-server, and a real world-2 training job. Every PromQL expression of every panel,
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
#include <unistd.h>

#include <chrono>
#include <map>
#include <memory>
#include <regex>
#include <thread>

#include "absl/strings/str_join.h"
#include "gpu_worker/trainer/job_spec.h"
#include "gradhub/v1/jobs.grpc.pb.h"
#include "tests/support/grafana_dashboard.h"
#include "tests/support/postgres_server.h"
#include "tests/support/prometheus_server.h"
#include "tests/support/subprocess.h"

namespace gradhub {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using testing::BinaryPath;
using testing::Subprocess;
using Clock = std::chrono::steady_clock;

constexpr char kAdmin[] = "dashboards-e2e-admin";

std::string AwaitPort(Subprocess& process, const std::string& pattern) {
  const std::regex re(pattern);
  const auto deadline = Clock::now() + seconds(30);
  while (Clock::now() < deadline && process.running()) {
    std::smatch match;
    const std::string out = process.out();
    if (std::regex_search(out, match, re)) return match[1].str();
    std::this_thread::sleep_for(milliseconds(50));
  }
  return "";
}

std::string SourcePath(const std::string& relative) {
  const char* root = std::getenv("GRADHUB_SOURCE_DIR");
  return std::string(root != nullptr ? root : ".") + "/" + relative;
}

std::string Tail(const std::string& text) {
  return text.substr(text.size() > 3000 ? text.size() - 3000 : 0);
}

struct Cluster {
  testing::TempDir dir;
  std::string url, api_grpc, api_rest, token, node_token, metrics_grpc, metrics_http,
      checkpoint_grpc, checkpoint_http, job;
  std::unique_ptr<Subprocess> api, metrics, checkpoint;
  std::vector<std::unique_ptr<Subprocess>> agents;
  std::unique_ptr<testing::PrometheusServer> prometheus;
  std::unique_ptr<v1::JobService::Stub> jobs;
  std::string error;  // why the cluster is not ready; empty when it is

  std::unique_ptr<grpc::ClientContext> Context() const {
    auto context = std::make_unique<grpc::ClientContext>();
    context->AddMetadata("authorization", "Bearer " + token);
    context->set_deadline(std::chrono::system_clock::now() + seconds(10));
    return context;
  }

  // Steps 1-2.
  bool StartServices() {
    url = testing::PostgresServer::Shared().CreateDatabase();
    api = std::make_unique<Subprocess>(std::vector<std::string>{
        BinaryPath("gradhub-api"), "--database-url", url, "--grpc-address", "127.0.0.1:0",
        "--http-host", "127.0.0.1", "--http-port", "0", "--heartbeat-interval", "1s",
        "--scheduler-interval", "100ms", "--admin-token", kAdmin, "serve"});
    api_grpc = AwaitPort(*api, "serving gRPC on port ([0-9]+)");
    api_rest = AwaitPort(*api, "serving REST on port ([0-9]+)");
    if (api_grpc.empty() || api_rest.empty()) return Fail("gradhub-api: " + Tail(api->err()));
    token = FirstLine(
        testing::Run({BinaryPath("gradhub-api"), "--database-url", url, "create-tenant", "team"})
            .out);
    node_token = FirstLine(
        testing::Run({BinaryPath("gradhub-api"), "--database-url", url, "create-node-token"}).out);
    metrics = std::make_unique<Subprocess>(std::vector<std::string>{
        BinaryPath("gradhub-metrics"), "--database-url", url, "--host", "127.0.0.1", "--grpc-port",
        "0", "--http-port", "0", "--admin-token", kAdmin, "--job-check-interval", "1s"});
    metrics_grpc = AwaitPort(*metrics, "serving gRPC on port ([0-9]+)");
    metrics_http = AwaitPort(*metrics, "serving HTTP on port ([0-9]+)");
    if (metrics_grpc.empty() || metrics_http.empty())
      return Fail("gradhub-metrics: " + Tail(metrics->err()));
    if (access(BinaryPath("gradhub-checkpoint").c_str(), X_OK) == 0) {
      checkpoint = std::make_unique<Subprocess>(std::vector<std::string>{
          BinaryPath("gradhub-checkpoint"), "--database-url", url, "--data-dir",
          dir.path() + "/store", "--grpc-port", "0", "--http-port", "0", "--admin-token", kAdmin});
      checkpoint_grpc = AwaitPort(*checkpoint, "serving gRPC on port ([0-9]+)");
      checkpoint_http = AwaitPort(*checkpoint, "serving (?:REST|HTTP) on port ([0-9]+)");
      if (checkpoint_grpc.empty() || checkpoint_http.empty()) {
        return Fail("gradhub-checkpoint: " + Tail(checkpoint->err()));
      }
    }
    jobs = v1::JobService::NewStub(
        grpc::CreateChannel("127.0.0.1:" + api_grpc, grpc::InsecureChannelCredentials()));
    return true;
  }

  // Step 3.
  bool StartAgents() {
    for (const std::string name : {"a", "b"}) {
      const std::string work = dir.path() + "/agent-" + name;
      std::vector<std::string> argv = {
          BinaryPath("gradhub-agent"),
          "--server",
          "127.0.0.1:" + api_grpc,
          "--token",
          node_token,
          "--name",
          name,
          "--slots",
          "1",
          "--work-dir",
          work,
          "--stop-grace",
          "2s",
          "--metrics-server",
          "127.0.0.1:" + metrics_grpc,
          "--checkpoint-root",
          checkpoint ? work + "/checkpoints" : dir.path() + "/checkpoints"};
      if (checkpoint)
        argv.insert(argv.end(), {"--checkpoint-server", "127.0.0.1:" + checkpoint_grpc});
      agents.push_back(std::make_unique<Subprocess>(argv));
      if (AwaitPort(*agents.back(), "(registered) as nodes/" + name).empty()) {
        return Fail("agent " + std::string(name) + ": " + Tail(agents.back()->err()));
      }
    }
    return true;
  }

  // Step 4.
  bool StartPrometheus() {
    std::vector<testing::ScrapeTarget> targets = {{"gradhub-api", "127.0.0.1:" + api_rest},
                                                  {"gradhub-metrics", "127.0.0.1:" + metrics_http}};
    if (checkpoint) targets.push_back({"gradhub-checkpoint", "127.0.0.1:" + checkpoint_http});
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
    const grpc::Status status = jobs->CreateJob(Context().get(), request, &created);
    if (!status.ok()) return Fail("CreateJob: " + status.error_message());
    job = created.name();
    v1::Job seen;
    const auto deadline = Clock::now() + seconds(120);
    do {
      std::this_thread::sleep_for(milliseconds(200));
      v1::GetJobRequest get;
      get.set_name(job);
      jobs->GetJob(Context().get(), get, &seen);
    } while (!(seen.state() == v1::Job::RUNNING && seen.progress().step() >= 100) &&
             Clock::now() < deadline && seen.state() != v1::Job::FAILED);
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
    jobs->GetJob(Context().get(), missing, &none);  // NOT_FOUND, on purpose
    std::this_thread::sleep_for(seconds(5));        // a few scrapes after all of it
    return true;
  }

  void CancelJob() {
    if (job.empty() || !jobs) return;
    v1::CancelJobRequest request;
    request.set_name(job);
    v1::Job cancelled;
    jobs->CancelJob(Context().get(), request, &cancelled);
  }

  bool Fail(const std::string& why) {
    error = why;
    return false;
  }
  static std::string FirstLine(const std::string& text) { return text.substr(0, text.find('\n')); }
};

class DashboardsE2eTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    cluster_ = new Cluster;
    if (!testing::PrometheusServer::Available()) {
      cluster_->error = "prometheus missing: install Debian's prometheus (make setup)";
      return;
    }
    cluster_->StartServices() && cluster_->StartAgents() && cluster_->StartPrometheus() &&
        cluster_->RunJob();
  }
  static void TearDownTestSuite() {
    cluster_->CancelJob();
    delete cluster_;
    cluster_ = nullptr;
  }

  // The panels of `file` without data, after leaving out those on services not running here.
  static std::vector<std::string> PanelsWithoutData(const std::string& file) {
    std::vector<testing::PanelQuery> queries;
    const std::vector<testing::PanelQuery> all = testing::DashboardQueries(SourcePath(file));
    EXPECT_GE(all.size(), 20u) << file << ": the dashboard lost its panels";
    for (auto query : all) {
      const bool on_checkpoint_service =
          query.expr.find("gradhub_checkpoint_") != std::string::npos &&
          query.expr.find("gradhub_checkpoint_save_seconds") == std::string::npos;
      if (on_checkpoint_service && !cluster_->checkpoint) continue;
      queries.push_back(std::move(query));
    }
    return testing::PanelsWithoutData(
        *cluster_->prometheus, queries,
        {{"job_id", cluster_->job.substr(cluster_->job.empty() ? 0 : 5)},
         {"datasource", "prometheus"},
         {"__rate_interval", "5m"},
         {"__interval", "1s"},
         {"__range", "10m"}});
  }

  void TearDown() override {
    if (!HasFailure()) return;
    if (cluster_->metrics)
      std::cerr << "--- gradhub-metrics stderr:\n" << Tail(cluster_->metrics->err()) << "\n";
    for (const auto& agent : cluster_->agents)
      std::cerr << "--- agent stderr:\n" << Tail(agent->err()) << "\n";
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
