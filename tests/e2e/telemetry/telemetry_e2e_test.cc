// Telemetry end to end: a real world-2 job on the local cluster reports every step of every
// rank to a real gradhub-metrics, which is SIGKILLed in the middle of the job and restarted.
// Telemetry is best effort: the outage may cost samples (counted), never training time.
#include <gtest/gtest.h>
#include <signal.h>

#include <regex>
#include <sstream>
#include <thread>

#include "services/common/contract/job_spec.h"
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
      "maxSteps: " +
      std::to_string(kSteps) +
      "\n"
      "logEverySteps: 100\n"
      "distributed: {worldSize: 2, ranksPerNode: 2}\n");
}

// A number from a rank's "done" line in the job's last attempt; -1 when absent.
double DoneField(LocalCluster& cluster, const std::string& name, const std::string& field,
                 int rank = 0) {
  const std::regex re("\"event\":\"done\".*\"" + field + "\":([0-9.e+-]+)");
  const auto deadline = Clock::now() + seconds(15);
  while (Clock::now() < deadline) {
    for (const std::string& line : cluster.Logs(name, 0, rank)) {
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

// The job's bus bandwidth as Prometheus reads it from gradhub-metrics (gradient bytes over
// allreduce time, all ranks, nccl-tests' 2 (n - 1) / n) against the engine's own measure, which
// each rank prints at the end: within 10%.
void ExpectBusBandwidthAsTheEngineMeasuredIt(LocalCluster& cluster, const std::string& name) {
  const double bytes =
      DoneField(cluster, name, "allreduceBytes", 0) + DoneField(cluster, name, "allreduceBytes", 1);
  const double seconds = DoneField(cluster, name, "allreduceSeconds", 0) +
                         DoneField(cluster, name, "allreduceSeconds", 1);
  ASSERT_GT(bytes, 0);
  ASSERT_GT(seconds, 0);
  const double engine = bytes / seconds * 2.0 * (2 - 1) / 2;
  const std::string id = name.substr(5);
  const std::string text = cluster.ScrapeMetrics();
  const double exported_bytes =
      Sample(text, "gradhub_allreduce_bytes_total{job_id=\"" + id + "\"}");
  const double exported_seconds =
      Sample(text, "gradhub_allreduce_seconds_sum{job_id=\"" + id + "\"}");
  ASSERT_GT(exported_seconds, 0) << text;
  const double exported = exported_bytes / exported_seconds * 2.0 * (2 - 1) / 2;
  EXPECT_NEAR(exported, engine, 0.10 * engine)
      << "exported " << exported_bytes << " bytes in " << exported_seconds << " s; the ranks "
      << bytes << " bytes in " << seconds << " s";
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

  ExpectBusBandwidthAsTheEngineMeasuredIt(cluster, reference);

  // The same job trained far longer, so that it is still running when the service is back.
  v1::JobSpec long_spec = Spec();
  long_spec.set_max_steps(kSteps * 50);
  const std::string name = cluster.Submit(long_spec).name();
  const v1::Job running = cluster.AwaitJob(name, [](const v1::Job& j) {
    return testing::Ended(j) || (j.state() == v1::Job::RUNNING && j.progress().step() >= 500);
  });
  ASSERT_EQ(running.state(), v1::Job::RUNNING) << running.state_reason();
  cluster.KillMetricsService(SIGKILL);
  const auto killed = Clock::now();
  // Down long enough that the trainers' queues (4096 steps each) overflow.
  std::this_thread::sleep_for(seconds(8));
  const v1::Job during = cluster.Get(name);
  const double outage = std::chrono::duration<double>(Clock::now() - killed).count();
  ASSERT_EQ(during.state(), v1::Job::RUNNING) << during.state_reason();
  ASSERT_TRUE(cluster.StartMetricsService());

  // Nothing blocks: training went on while the service was down. The bound is loose on
  // purpose (tests share the machine; speed is measured in tests/bench/telemetry), but a
  // reporter that waited on the network (a connect deadline per batch) would fall far below it.
  // Progress reaches the api every logEverySteps, so allow one interval.
  const double reference_rate = kSteps / reference_seconds;
  const double outage_rate = (during.progress().step() - running.progress().step() + 100) / outage;
  EXPECT_GT(outage_rate, reference_rate / 5)
      << "steps/s while the service was down " << outage_rate << ", with it up " << reference_rate;

  // The restarted service receives again, and hears what the trainers had to drop.
  const std::string id = name.substr(5);
  const std::string rank0 = "gradhub_training_step{job_id=\"" + id + "\",rank=\"0\"}";
  const std::string rank1 = "gradhub_training_step{job_id=\"" + id + "\",rank=\"1\"}";
  std::string text;
  const auto deadline = Clock::now() + seconds(30);
  while (Clock::now() < deadline) {
    text = cluster.ScrapeMetrics();
    if (Sample(text, rank0) > during.progress().step() &&
        Sample(text, rank1) > during.progress().step()) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  EXPECT_GT(Sample(text, rank0), during.progress().step()) << text;
  EXPECT_GT(Sample(text, rank1), during.progress().step());
  EXPECT_GT(Sample(text, "gradhub_telemetry_dropped_total{reason=\"trainer_queue_full\"}"), 0)
      << text;
  const v1::Job still = cluster.Get(name);
  EXPECT_EQ(still.state(), v1::Job::RUNNING) << "the outage must not fail the attempt";
  EXPECT_EQ(still.attempt(), 1);
  cluster.Cancel(name);
}

}  // namespace
}  // namespace gradhub
