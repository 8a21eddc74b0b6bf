// gradhub-metrics: trainers stream per-step telemetry here (gRPC, TelemetryService); Prometheus
// scrapes it at /metrics. Jobs' states and tokens come from the api's PostgreSQL database.
#include <grpcpp/grpcpp.h>
#include <signal.h>

#include <condition_variable>
#include <iostream>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "services/common/abseil_mode.h"
#include "services/common/auth/authenticator.h"
#include "services/common/db/pool.h"
#include "services/common/grpc_credentials.h"
#include "services/common/shutdown_signals.h"
#include "services/metrics/config.h"
#include "services/metrics/http_endpoint.h"
#include "services/metrics/job_directory.h"
#include "services/metrics/telemetry_service.h"
#include "services/metrics/training_metrics.h"

namespace {

using gradhub::metrics::MetricsConfig;

constexpr char kSummary[] =
    "gradhub-metrics: receives trainers' per-step telemetry over gRPC (TelemetryService) and\n"
    "exposes it to Prometheus at /metrics, with /healthz and /readyz.\n\n"
    "Usage: gradhub-metrics [flags]";

// Idle gRPC threads kept: every open stream holds one, and trainers reconnect in bursts.
constexpr int kMaxIdleRpcThreads = 64;

// Every interval, on a thread of its own until Stop(), starting at once: checks that the
// database answers (what /readyz reports, without a query per probe) and runs
// TrainingMetrics::Sweep.
class Sweeper {
 public:
  Sweeper(gradhub::db::Pool* pool, gradhub::metrics::TrainingMetrics* metrics,
          absl::Duration interval)
      : pool_(pool), metrics_(metrics), interval_(interval), thread_([this] { Loop(); }) {}
  ~Sweeper() { Stop(); }

  void Stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    wake_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  absl::Status ready() const {
    std::lock_guard<std::mutex> lock(mu_);
    return ready_;
  }

 private:
  void Loop() {
    std::unique_lock<std::mutex> lock(mu_);
    do {
      lock.unlock();
      absl::Status database = pool_->Exec("SELECT 1 FROM jobs LIMIT 1").status();
      if (absl::Status swept = metrics_->Sweep(); !swept.ok()) {
        std::cerr << "gradhub-metrics: reading job states: " << swept << "\n";
      }
      lock.lock();
      ready_ = database.ok()
                   ? absl::OkStatus()
                   : absl::UnavailableError(absl::StrCat("database: ", database.message()));
    } while (
        !wake_.wait_for(lock, absl::ToChronoMilliseconds(interval_), [this] { return stopping_; }));
  }

  gradhub::db::Pool* pool_;
  gradhub::metrics::TrainingMetrics* metrics_;
  const absl::Duration interval_;
  mutable std::mutex mu_;
  std::condition_variable wake_;
  bool stopping_ = false;
  absl::Status ready_ = absl::UnavailableError("database not checked yet");
  std::thread thread_;  // last: starts once the members above exist
};

gradhub::db::PoolOptions PoolFor(const MetricsConfig& config) {
  gradhub::db::PoolOptions options = config.database.Pool("gradhub-metrics");
  // A trainer's batch waits for a connection only when its job is new; better dropped than late.
  options.acquire_timeout = absl::Seconds(2);
  return options;
}

// Keepalive both ways: trainers ping every 10 s (telemetry_client), so a dead server is noticed
// while a stream is idle; the server pings too, so a trainer that vanished frees its thread.
void SetKeepalive(grpc::ServerBuilder& builder) {
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 30000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10000);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 5000);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
}

int Serve(const MetricsConfig& config) {
  auto credentials = gradhub::ServerCredentials(config.tls_cert_file, config.tls_key_file);
  if (!credentials.ok()) {
    std::cerr << "gradhub-metrics: " << credentials.status().message() << "\n";
    return 2;
  }
  const gradhub::ShutdownSignals signals;

  gradhub::db::Pool pool(PoolFor(config));
  gradhub::api::Authenticator auth(&pool, config.admin_token);
  gradhub::metrics::PostgresJobDirectory directory(&pool);
  gradhub::metrics::TrainingMetrics metrics(&directory,
                                            {.max_jobs = static_cast<int>(config.max_jobs),
                                             .finished_job_ttl = config.finished_job_ttl,
                                             .idle_job_ttl = config.idle_job_ttl});
  gradhub::metrics::TelemetryService service(&metrics, [&auth](const std::string& authorization) {
    return auth.RequireNodeOrAdmin(authorization);
  });

  int grpc_port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort(config.host + ":" + std::to_string(config.grpc_port), *credentials,
                           &grpc_port);
  SetKeepalive(builder);
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MAX_POLLERS,
                              kMaxIdleRpcThreads);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || grpc_port == 0) {
    std::cerr << "gradhub-metrics: cannot serve gRPC on " << config.host << ":" << config.grpc_port
              << "\n";
    return 1;
  }
  Sweeper sweeper(&pool, &metrics, config.job_check_interval);
  gradhub::metrics::HttpEndpoint http({.scrape = [&metrics] { return metrics.Scrape(); },
                                       .ready = [&sweeper] { return sweeper.ready(); }});
  const absl::StatusOr<int> http_port = http.Start(config.host, static_cast<int>(config.http_port));
  if (!http_port.ok()) {
    std::cerr << "gradhub-metrics: HTTP: " << http_port.status().message() << "\n";
    return 1;
  }
  // Lines a launcher can parse for the ports actually bound.
  std::cout << "gradhub-metrics: serving HTTP on port " << *http_port << std::endl;
  std::cout << "gradhub-metrics: serving gRPC on port " << grpc_port << std::endl;

  const int received = signals.Wait();
  std::cerr << "gradhub-metrics: signal " << received << ", shutting down\n";
  sweeper.Stop();
  // Streams stay open for a trainer's whole life: they get the grace, then are cancelled, and
  // their reporters reconnect to whichever instance comes next.
  server->Shutdown(std::chrono::system_clock::now() +
                   absl::ToChronoMilliseconds(config.shutdown_grace));
  server->Wait();
  http.Stop();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  gradhub::TurnOffMutexDeadlockDetection();
  MetricsConfig config;
  gradhub::Flags flags("gradhub-metrics", kSummary);
  config.Register(flags);
  std::vector<std::string> args;
  if (std::optional<int> exit = flags.ParseOrExitCode(argc, argv, &args)) return *exit;
  if (!args.empty()) {
    std::cerr << flags.Usage();
    return 2;
  }
  return Serve(config);
}
