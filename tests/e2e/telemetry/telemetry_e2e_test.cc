// Telemetry end to end: a real world-2 job on the local cluster reports every step of every
// rank to a real gradhub-metrics, which is SIGKILLed in the middle of the job and restarted.
// Telemetry is best effort: the outage may cost samples (counted), never training time.
#include <gtest/gtest.h>
#include <signal.h>

#include <regex>
#include <sstream>
#include <thread>

#include "gpu_worker/trainer/job_spec.h"
#include "tests/support/local_cluster.h"

namespace gradhub {
namespace {

using std::chrono::seconds;
using testing::LocalCluster;
using Clock = std::chrono::steady_clock;

constexpr int64_t kSteps = 40000;

v1::JobSpec Spec() {
  return ParseJobSpec(
      "model: {mlp: {layers: [32, 64, 4]}}\n"
      "dataset: {synthetic: {numSamples: 4096, numFeatures: 32, numClasses: 4, noise: 0.5},"
      " validationFraction: 0.1}\n"
      "optimizer: {sgd: {lr: 0.05, momentum: 0.9}}\n"
      "batchSizePerRank: 16\n"
      "maxSteps: " + std::to_string(kSteps) + "\n"
      "logEverySteps: 100\n"
      "distributed: {worldSize: 2, ranksPerNode: 2}\n");
}

// A number from rank 0's "done" line of the job's last attempt; -1 when absent.
double DoneField(LocalCluster& cluster, const std::string& name, const std::string& field) {
  const std::regex re("\"event\":\"done\".*\"" + field + "\":([0-9.e+-]+)");
  const auto deadline = Clock::now() + seconds(15);
  while (Clock::now() < deadline) {
    for (const std::string& line : cluster.Logs(name, 0, 0)) {
      std::smatch match;
      if (std::regex_search(line, match, re)) return std::stod(match[1].str());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  return -1;
}

// The value of the sample `series` (name and labels exactly as exposed) in Prometheus text.
double Sample(const std::string& text, const std::string& series) {
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind(series + " ", 0) == 0) return std::stod(line.substr(series.size() + 1));
  }
  return -1;
}

TEST(TelemetryE2eTest, MetricsServiceKilledMidJobCostsSamplesNotTrainingTime) {
  testing::LocalClusterOptions options;
  options.metrics_service = true;
  LocalCluster cluster(options);
  ASSERT_TRUE(cluster.Start());

  // The same job with the service up all along: the training time to hold the other to.
  const std::string reference = cluster.Submit(Spec()).name();
  ASSERT_EQ(cluster.AwaitJob(reference, testing::Ended, seconds(300)).state(), v1::Job::SUCCEEDED);
  const double reference_seconds = DoneField(cluster, reference, "trainSeconds");
  ASSERT_GT(reference_seconds, 0);

  const std::string name = cluster.Submit(Spec()).name();
  const v1::Job running = cluster.AwaitJob(name, [](const v1::Job& j) {
    return testing::Ended(j) || (j.state() == v1::Job::RUNNING && j.progress().step() >= 500);
  });
  ASSERT_EQ(running.state(), v1::Job::RUNNING) << running.state_reason();
  ASSERT_LT(running.progress().step(), kSteps / 2) << "too fast for the outage to fall mid-job";
  cluster.KillMetricsService(SIGKILL);
  // Down long enough that the trainers' queues (4096 steps each) overflow.
  std::this_thread::sleep_for(seconds(8));
  const v1::Job during = cluster.Get(name);
  ASSERT_EQ(during.state(), v1::Job::RUNNING) << "ended during the outage: make the job longer";
  ASSERT_TRUE(cluster.StartMetricsService());

  const v1::Job done = cluster.AwaitJob(name, testing::Ended, seconds(300));
  ASSERT_EQ(done.state(), v1::Job::SUCCEEDED) << done.state_reason() << cluster.Describe(name);
  EXPECT_EQ(done.attempt(), 1) << "a metrics outage must not fail the attempt";
  EXPECT_GT(during.progress().step(), running.progress().step() + 500)
      << "training stalled while the service was down: step " << running.progress().step()
      << " -> " << during.progress().step();
  // Nothing blocks: the loop is as fast as with the service up (a generous bound: the
  // machine is shared; a reporter that waited on the network would cost seconds per batch).
  const double seconds_with_outage = DoneField(cluster, name, "trainSeconds");
  EXPECT_LT(seconds_with_outage, reference_seconds * 1.5 + 2) << "reference " << reference_seconds;

  // The restarted service receives again, and hears what the trainers had to drop.
  const std::string id = name.substr(5);
  std::string text;
  const auto deadline = Clock::now() + seconds(20);
  while (Clock::now() < deadline) {
    text = cluster.ScrapeMetrics();
    if (Sample(text, "gradhub_training_step{job_id=\"" + id + "\",rank=\"0\"}") == kSteps) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  EXPECT_EQ(Sample(text, "gradhub_training_step{job_id=\"" + id + "\",rank=\"0\"}"), kSteps) << text;
  EXPECT_EQ(Sample(text, "gradhub_training_step{job_id=\"" + id + "\",rank=\"1\"}"), kSteps);
  EXPECT_GT(Sample(text, "gradhub_telemetry_dropped_total{reason=\"trainer_queue_full\"}"), 0)
      << text;
}

}  // namespace
}  // namespace gradhub
