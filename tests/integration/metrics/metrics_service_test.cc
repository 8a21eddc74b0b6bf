// gradhub-metrics as a real process against a real PostgreSQL, fed by TelemetryReporter as a
// trainer feeds it: what arrives shows at /metrics; a service that is down, SIGKILLed or
// restarted costs the reporter nothing but counted drops; refusals are counted; SIGTERM ends it.
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>

#include <atomic>
#include <mutex>
#include <thread>
#include <vector>

#include "gpu_worker/telemetry_client/telemetry_reporter.h"
#include "gradhub/v1/telemetry.grpc.pb.h"
#include "tests/integration/metrics/metrics_test_util.h"
#include "tests/support/postgres_server.h"
#include "tests/support/prometheus_server.h"

namespace gradhub::metrics {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using ::testing::HasSubstr;
using ::testing::Not;
using Clock = std::chrono::steady_clock;
using telemetry_client::StepFigures;
using telemetry_client::TelemetryReporter;
using telemetry_client::TelemetryReporterOptions;

// A step as a trainer reports it (and, through FillStepTelemetry, as raw batches carry it).
StepFigures Step(int64_t step) {
  StepFigures figures;
  figures.step = step;
  figures.loss = 2.0 / static_cast<double>(step + 1);
  figures.learning_rate = 0.05;
  figures.samples = 16;
  figures.samples_per_second = 800;
  figures.step_seconds = 0.02;
  figures.allreduce_bytes = 4096;
  figures.allreduce_seconds = 0.001;
  return figures;
}

std::string Series(const std::string& name, const std::string& job, int rank) {
  return name + "{job_id=\"" + job.substr(5) + "\",rank=\"" + std::to_string(rank) + "\"}";
}

double Dropped(const std::string& exposition, const std::string& reason) {
  return SampleOf(exposition, "gradhub_telemetry_dropped_total{reason=\"" + reason + "\"}");
}

class MetricsServiceTest : public MetricsDatabaseTest {
 protected:
  TelemetryReporterOptions ReporterFor(const std::string& address, const std::string& job,
                                       int rank) {
    TelemetryReporterOptions options;
    options.address = address;
    options.token = JobToken(job, 1, rank);  // a trainer rank's own credential
    options.job = job;
    options.rank = rank;
    options.node = "nodes/test";
    options.batch_steps = 8;
    options.batch_interval = milliseconds(50);
    options.backoff.initial = milliseconds(50);
    options.backoff.max = milliseconds(400);
    options.log = [](const std::string&) {};
    return options;
  }

  // Polls the exposition until `series` reaches `value`; returns the last value seen.
  double AwaitSample(const MetricsProcess& metrics, const std::string& series, double value,
                     seconds limit = seconds(10)) {
    const auto deadline = Clock::now() + limit;
    double seen = SampleOf(metrics.Scrape(), series);
    while (!(seen >= value) && Clock::now() < deadline) {
      std::this_thread::sleep_for(milliseconds(50));
      seen = SampleOf(metrics.Scrape(), series);
    }
    return seen;
  }

  grpc::Status SendRaw(const std::string& address, const std::string& token,
                       const std::vector<v1::TelemetryBatch>& batches,
                       v1::ReportTelemetryResponse* response) {
    auto stub = v1::TelemetryService::NewStub(
        grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    context.AddMetadata("authorization", "Bearer " + token);
    context.set_deadline(std::chrono::system_clock::now() + seconds(10));
    auto writer = stub->ReportTelemetry(&context, response);
    for (const auto& batch : batches) {
      if (!writer->Write(batch)) break;
    }
    writer->WritesDone();
    return writer->Finish();
  }
};

v1::TelemetryBatch BatchOf(const std::string& job, int attempt, int rank,
                           std::vector<int64_t> steps) {
  v1::TelemetryBatch batch;
  batch.set_job(job);
  batch.set_attempt(attempt);
  batch.set_rank(rank);
  for (int64_t step : steps) telemetry_client::FillStepTelemetry(Step(step), batch.add_steps());
  return batch;
}

TEST_F(MetricsServiceTest, ReportedStepsShowAtMetricsAndEveryOneIsAccepted) {
  MetricsProcess metrics(url_);
  ASSERT_TRUE(metrics.Start());
  EXPECT_EQ(metrics.Get("/healthz").first, 200);
  // Ready once its first check of the database is done.
  const auto ready_by = Clock::now() + seconds(5);
  while (metrics.Get("/readyz").first != 200 && Clock::now() < ready_by) {
    std::this_thread::sleep_for(milliseconds(20));
  }
  EXPECT_EQ(metrics.Get("/readyz").first, 200);
  const std::string job = InsertJob(2);
  TelemetryReporter rank0(ReporterFor(metrics.address(), job, 0));
  TelemetryReporter rank1(ReporterFor(metrics.address(), job, 1));
  for (int64_t step = 1; step <= 100; ++step) {
    rank0.Report(Step(step));
    rank1.Report(Step(step));
  }
  EXPECT_TRUE(rank0.Close(Clock::now() + seconds(10)));
  EXPECT_TRUE(rank1.Close(Clock::now() + seconds(10)));
  EXPECT_EQ(rank0.stats().accepted, 100);
  EXPECT_EQ(rank0.stats().dropped, 0);
  const std::string text = metrics.Scrape();
  EXPECT_EQ(SampleOf(text, Series("gradhub_training_step", job, 0)), 100);
  EXPECT_EQ(SampleOf(text, Series("gradhub_training_step", job, 1)), 100);
  EXPECT_EQ(SampleOf(text, Series("gradhub_samples_total", job, 1)), 1600);
  EXPECT_EQ(SampleOf(text, "gradhub_allreduce_bytes_total{job_id=\"" + job.substr(5) + "\"}"),
            2 * 100 * 4096);
  EXPECT_EQ(SampleOf(text, "gradhub_telemetry_steps_total"), 200);
  EXPECT_EQ(SampleOf(text, "gradhub_telemetry_streams"), 0);
}

// What telemetry costs a trainer's process per step, Report() and the sender thread together
// (serializing, gRPC), in CPU time: steadier than throughput on a shared machine. A step of a
// small model takes a millisecond or more; the cost must stay a small fraction of that.
TEST_F(MetricsServiceTest, CpuCostPerStepIsMicroseconds) {
  MetricsProcess metrics(url_);
  ASSERT_TRUE(metrics.Start());
  const std::string job = InsertJob(1);
  TelemetryReporterOptions options = ReporterFor(metrics.address(), job, 0);
  options.queue_capacity = 100000;
  options.batch_steps = 32;
  constexpr int64_t kSteps = 50000;
  auto cpu_seconds = [] {
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    return static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
           1e-6 * static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec);
  };
  const double cpu_before = cpu_seconds();
  const auto start = Clock::now();
  TelemetryReporter reporter(options);
  for (int64_t step = 1; step <= kSteps; ++step) {
    StepFigures figures = Step(step);
    figures.time = std::chrono::system_clock::now();  // as the trainer stamps its steps
    figures.forward_seconds = 0.001;
    figures.backward_seconds = 0.002;
    figures.allreduce_wait_seconds = 0.0005;
    figures.optimizer_seconds = 0.0005;
    figures.bus_bandwidth_bytes_per_second = 1e9;
    figures.buckets = 2;
    reporter.Report(figures);
  }
  const auto reported = Clock::now();
  ASSERT_TRUE(reporter.Close(Clock::now() + seconds(60)));
  const double cpu_us = (cpu_seconds() - cpu_before) * 1e6 / kSteps;
  const double report_us =
      std::chrono::duration<double, std::micro>(reported - start).count() / kSteps;
  std::cout << "telemetry per step: " << cpu_us << " us CPU (Report and sender), Report() "
            << report_us << " us wall\n";
  EXPECT_EQ(reporter.stats().accepted, kSteps);
  EXPECT_LT(cpu_us, 50);
}

TEST_F(MetricsServiceTest, ServiceDownReportStaysFastAndDropsAreCounted) {
  const std::string job = InsertJob(1);
  // Nothing listens there.
  TelemetryReporterOptions options =
      ReporterFor("127.0.0.1:" + std::to_string(testing::FreeLoopbackPort()), job, 0);
  options.queue_capacity = 1000;
  TelemetryReporter reporter(options);
  auto slowest = Clock::duration::zero();
  const auto start = Clock::now();
  for (int64_t step = 1; step <= 20000; ++step) {
    const auto before = Clock::now();
    reporter.Report(Step(step));
    slowest = std::max(slowest, Clock::now() - before);
  }
  const auto total = Clock::now() - start;
  // 20,000 steps: a few microseconds each; the slowest one was not held up by the network
  // (the bound is loose for a loaded 2-core test machine).
  EXPECT_LT(total, milliseconds(1000));
  EXPECT_LT(slowest, milliseconds(50));
  // Not dropped yet: at most the queue and the batch the sender holds while it fails.
  EXPECT_GE(reporter.stats().dropped,
            static_cast<int64_t>(20000 - options.queue_capacity - options.batch_steps));
  const auto closing = Clock::now();
  EXPECT_FALSE(reporter.Close(Clock::now() + milliseconds(300)));
  EXPECT_LT(Clock::now() - closing, milliseconds(1500));
  EXPECT_GE(reporter.stats().failures, 1);  // it did try
  EXPECT_EQ(reporter.stats().dropped, 20000);
  EXPECT_EQ(reporter.stats().sent, 0);
}

// The metrics service dies mid-stream while a "trainer" reports a step every 2 ms: Report()
// stays fast, what the queue cannot hold is dropped and counted, and once the service is back
// on its port the reporter sends again, with its drop count.
TEST_F(MetricsServiceTest, KilledMidStreamThenRestartedReceivesAgain) {
  MetricsProcess metrics(url_);
  ASSERT_TRUE(metrics.Start());
  const std::string job = InsertJob(1);
  TelemetryReporterOptions options = ReporterFor(metrics.address(), job, 0);
  options.queue_capacity = 100;
  TelemetryReporter reporter(options);
  std::atomic<int64_t> step{0};
  std::atomic<bool> stop{false};
  std::atomic<int64_t> slowest_us{0};
  std::thread trainer([&] {
    while (!stop) {
      const auto before = Clock::now();
      reporter.Report(Step(++step));
      const int64_t us =
          std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - before).count();
      if (us > slowest_us) slowest_us = us;
      std::this_thread::sleep_for(milliseconds(2));
    }
  });
  const std::string step_series = Series("gradhub_training_step", job, 0);
  EXPECT_GE(AwaitSample(metrics, step_series, 50), 50);

  metrics.Kill(SIGKILL);
  metrics.Wait(seconds(5));
  const int64_t killed_at = step;
  std::this_thread::sleep_for(milliseconds(1500));  // ~700 steps, the queue holds 100
  EXPECT_GT(reporter.stats().dropped, 0);
  EXPECT_GE(reporter.stats().failures, 1);

  ASSERT_TRUE(metrics.Start());  // same ports
  const int64_t restarted_at = step;
  EXPECT_GT(restarted_at - killed_at, 500) << "the trainer was held up while the service was down";
  EXPECT_GE(AwaitSample(metrics, step_series, static_cast<double>(restarted_at + 50)),
            restarted_at + 50);
  stop = true;
  trainer.join();
  EXPECT_TRUE(reporter.Close(Clock::now() + seconds(10)));
  EXPECT_LT(slowest_us, 50000);
  // The restarted service learned the reporter's cumulative drop count from its batches.
  const auto stats = reporter.stats();
  const std::string text = metrics.Scrape();
  EXPECT_EQ(Dropped(text, "trainer_queue_full"), stats.dropped);
  EXPECT_EQ(SampleOf(text, step_series), step);
  EXPECT_EQ(stats.reported, step);
}

TEST_F(MetricsServiceTest, RefusesOtherTokensAndMalformedBatches) {
  MetricsProcess metrics(url_);
  ASSERT_TRUE(metrics.Start());
  const std::string job = InsertJob(1);
  v1::ReportTelemetryResponse response;
  EXPECT_EQ(
      SendRaw(metrics.address(), "not-a-token", {BatchOf(job, 1, 0, {1})}, &response).error_code(),
      grpc::StatusCode::UNAUTHENTICATED);
  api::Authenticator auth(pool_.get(), "");
  ASSERT_TRUE(auth.CreateTenant("other", "").ok());
  auto tenant_token = auth.CreateTenantToken("other", "");
  ASSERT_TRUE(tenant_token.ok());
  EXPECT_EQ(SendRaw(metrics.address(), tenant_token->secret, {BatchOf(job, 1, 0, {1})}, &response)
                .error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  // Nor a node token: every rank reports with its own job token.
  const grpc::Status node =
      SendRaw(metrics.address(), node_token_, {BatchOf(job, 1, 0, {1})}, &response);
  EXPECT_EQ(node.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(node.error_message(), HasSubstr("job token"));
  const grpc::Status malformed =
      SendRaw(metrics.address(), kAdminToken, {BatchOf("jobs/nope", 1, 0, {1})}, &response);
  EXPECT_EQ(malformed.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(malformed.error_message(), HasSubstr("job"));
  // The admin token may report (an operator, a trainer started by hand).
  ASSERT_TRUE(
      SendRaw(metrics.address(), kAdminToken, {BatchOf(job, 1, 0, {1, 2})}, &response).ok());
  EXPECT_EQ(response.accepted_steps(), 2);
}

// The clients' retry policy (services/common/grpc_retry.h): PERMISSION_DENIED (a tenant's token
// may not report) is final, so the reporter stops instead of reconnecting every backoff, and
// what is reported after that is counted dropped.
TEST_F(MetricsServiceTest, ReporterStopsAtAFinalRefusal) {
  MetricsProcess metrics(url_);
  ASSERT_TRUE(metrics.Start());
  const std::string job = InsertJob(1);
  api::Authenticator auth(pool_.get(), "");
  ASSERT_TRUE(auth.CreateTenant("other", "").ok());
  auto tenant_token = auth.CreateTenantToken("other", "");
  ASSERT_TRUE(tenant_token.ok());
  std::mutex log_mu;
  std::vector<std::string> log;
  TelemetryReporterOptions options = ReporterFor(metrics.address(), job, 0);
  options.token = tenant_token->secret;
  options.log = [&](const std::string& line) {
    std::lock_guard<std::mutex> lock(log_mu);
    log.push_back(line);
  };
  TelemetryReporter reporter(options);
  int64_t step = 0;
  // A bound, not a timing: the refusal came after 10 s once on a loaded 2-core machine.
  const auto deadline = Clock::now() + seconds(60);
  while (reporter.stats().failures == 0 && Clock::now() < deadline) {
    reporter.Report(Step(++step));
    std::this_thread::sleep_for(milliseconds(5));
  }
  ASSERT_EQ(reporter.stats().failures, 1);
  // Several backoffs (50 to 400 ms) long: a reporter that retried would have opened more.
  std::this_thread::sleep_for(milliseconds(1000));
  const int64_t dropped_before = reporter.stats().dropped;
  for (int i = 0; i < 10; ++i) reporter.Report(Step(++step));
  const auto stats = reporter.stats();
  EXPECT_EQ(stats.streams, 1);
  EXPECT_EQ(stats.failures, 1);
  EXPECT_EQ(stats.dropped, dropped_before + 10);
  EXPECT_FALSE(reporter.Close(Clock::now() + seconds(1)));
  EXPECT_EQ(reporter.stats().sent + reporter.stats().dropped, step);
  std::lock_guard<std::mutex> lock(log_mu);
  ASSERT_EQ(log.size(), 1u);
  EXPECT_THAT(log[0], HasSubstr("not retrying"));
}

TEST_F(MetricsServiceTest, StaleAttemptsUnknownJobsAndDuplicatesAreDroppedAndCounted) {
  MetricsProcess metrics(url_);
  ASSERT_TRUE(metrics.Start());
  const std::string job = InsertJob(1, /*attempt=*/2);
  v1::ReportTelemetryResponse response;
  ASSERT_TRUE(SendRaw(metrics.address(), kAdminToken,
                      {BatchOf(job, 1, 0, {10, 11}), BatchOf(job, 2, 0, {1, 2, 3}),
                       BatchOf(job, 2, 0, {3, 4}),
                       BatchOf("jobs/00000000-0000-4000-8000-000000000000", 1, 0, {1})},
                      &response)
                  .ok());
  EXPECT_EQ(response.accepted_steps(), 4);
  const std::string text = metrics.Scrape();
  EXPECT_EQ(Dropped(text, "stale_attempt"), 2);
  EXPECT_EQ(Dropped(text, "duplicate_step"), 1);
  EXPECT_EQ(Dropped(text, "unknown_job"), 1);
  EXPECT_EQ(SampleOf(text, Series("gradhub_training_step", job, 0)), 4);
}

TEST_F(MetricsServiceTest, FinishedJobsSeriesExpireAndTheJobLimitHolds) {
  MetricsProcess metrics(
      url_, {"--max-jobs", "1", "--finished-job-ttl", "1s", "--job-check-interval", "200ms"});
  ASSERT_TRUE(metrics.Start());
  const std::string first = InsertJob(1), second = InsertJob(1);
  v1::ReportTelemetryResponse response;
  ASSERT_TRUE(SendRaw(metrics.address(), kAdminToken,
                      {BatchOf(first, 1, 0, {1}), BatchOf(second, 1, 0, {1, 2})}, &response)
                  .ok());
  EXPECT_EQ(response.accepted_steps(), 1);
  std::string text = metrics.Scrape();
  EXPECT_EQ(Dropped(text, "job_limit"), 2);
  EXPECT_THAT(text, Not(HasSubstr(second.substr(5))));

  SetJob(first, "SUCCEEDED", 1);
  const auto deadline = Clock::now() + seconds(10);
  while (metrics.Scrape().find(first.substr(5)) != std::string::npos && Clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(100));
  }
  EXPECT_THAT(metrics.Scrape(), Not(HasSubstr(first.substr(5))));
  EXPECT_EQ(SampleOf(metrics.Scrape(), "gradhub_telemetry_jobs"), 0);
}

TEST_F(MetricsServiceTest, NotReadyWhileTheDatabaseIsDown) {
  if (testing::PostgresServer::Shared().external()) GTEST_SKIP() << "needs our own PostgreSQL";
  MetricsProcess metrics(url_, {"--job-check-interval", "200ms"});
  ASSERT_TRUE(metrics.Start());
  auto await_status = [&](int status) {
    const auto deadline = Clock::now() + seconds(20);
    while (metrics.Get("/readyz").first != status && Clock::now() < deadline) {
      std::this_thread::sleep_for(milliseconds(50));
    }
    return metrics.Get("/readyz").first;
  };
  EXPECT_EQ(await_status(200), 200);
  testing::PostgresServer::Shared().Stop();
  EXPECT_EQ(await_status(503), 503);
  EXPECT_EQ(metrics.Get("/healthz").first, 200);
  testing::PostgresServer::Shared().Start();
  EXPECT_EQ(await_status(200), 200);
}

TEST_F(MetricsServiceTest, SigtermEndsOpenStreamsAndExits) {
  MetricsProcess metrics(url_, {"--shutdown-grace", "500ms"});
  ASSERT_TRUE(metrics.Start());
  const std::string job = InsertJob(1);
  TelemetryReporter reporter(ReporterFor(metrics.address(), job, 0));
  for (int64_t step = 1; step <= 10; ++step) reporter.Report(Step(step));
  EXPECT_GE(AwaitSample(metrics, "gradhub_telemetry_streams", 1), 1);
  const auto start = Clock::now();
  metrics.Kill(SIGTERM);
  EXPECT_EQ(metrics.Wait(seconds(10)), 0) << metrics.process().err();
  EXPECT_LT(Clock::now() - start, seconds(5));
  reporter.Close(Clock::now());
}

}  // namespace
}  // namespace gradhub::metrics
