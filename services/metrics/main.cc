// gradhub-metrics: trainers stream per-step telemetry here (gRPC, TelemetryService), script ranks
// post it (HTTP, POST /v1/telemetry); Prometheus scrapes it at /metrics. Jobs' states and tokens
// come from the api's PostgreSQL database.
#include <grpcpp/grpcpp.h>
#include <signal.h>

#include <iostream>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "services/common/abseil_mode.h"
#include "services/common/auth/authenticator.h"
#include "services/common/db/pool.h"
#include "services/common/grpc_credentials.h"
#include "services/common/grpc_server.h"
#include "services/common/periodic_task.h"
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
    "script ranks' over HTTP (POST /v1/telemetry), and exposes it to Prometheus at /metrics,\n"
    "with /healthz and /readyz.\n\n"
    "Usage: gradhub-metrics [flags]";

// Idle gRPC threads kept: every open stream holds one, and trainers reconnect in bursts.
constexpr int kMaxIdleRpcThreads = 64;

// What /readyz reports: whether the database answered the last sweep. Thread-safe: the sweep
// writes it, HTTP request threads read it.
class DatabaseReadiness {
 public:
  void Set(absl::Status status) {
    std::lock_guard<std::mutex> lock(mu_);
    ready_ = std::move(status);
  }
  absl::Status Get() const {
    std::lock_guard<std::mutex> lock(mu_);
    return ready_;
  }

 private:
  mutable std::mutex mu_;
  absl::Status ready_ = absl::UnavailableError("database not checked yet");
};

// One sweep (a PeriodicTask, at start and every --job-check-interval): checks that the database
// answers (what /readyz reports, without a query per probe) and runs TrainingMetrics::Sweep.
void Sweep(gradhub::db::Pool& pool, gradhub::metrics::TrainingMetrics& metrics,
           DatabaseReadiness& readiness) {
  const absl::Status database = pool.Exec("SELECT 1 FROM jobs LIMIT 1").status();
  if (absl::Status swept = metrics.Sweep(); !swept.ok()) {
    std::cerr << "gradhub-metrics: reading job states: " << swept << "\n";
  }
  readiness.Set(database.ok()
                    ? absl::OkStatus()
                    : absl::UnavailableError(absl::StrCat("database: ", database.message())));
}

gradhub::db::PoolOptions PoolFor(const MetricsConfig& config) {
  gradhub::db::PoolOptions options = config.server.database.Pool("gradhub-metrics");
  // A trainer's batch waits for a connection only when its job is new; better dropped than late.
  options.acquire_timeout = absl::Seconds(2);
  return options;
}

// The server's parts, built in dependency order (members are initialized in declaration order
// and destroyed in reverse, so that nothing outlives what it points to). Nothing runs yet.
struct MetricsServer {
  explicit MetricsServer(const MetricsConfig& config)
      : pool(PoolFor(config)),
        auth(&pool, config.server.admin_token),
        directory(&pool),
        metrics(&directory, {.max_jobs = static_cast<int>(config.max_jobs),
                             .finished_job_ttl = config.finished_job_ttl,
                             .idle_job_ttl = config.idle_job_ttl}),
        service(&metrics,
                [this](const std::string& authorization) { return Authorize(authorization); }),
        sweeper(
            config.job_check_interval, [this] { Sweep(pool, metrics, readiness); },
            gradhub::PeriodicTask::FirstRun::kAtStart),
        http({.scrape = [this] { return metrics.Scrape(); },
              .ready = [this] { return readiness.Get(); },
              .authorize =
                  [this](const std::string& authorization) { return Authorize(authorization); },
              .metrics = &metrics,
              .tls_cert_file = config.server.tls.cert_file,
              .tls_key_file = config.server.tls.key_file,
              .limits = config.server.http}) {}

  absl::StatusOr<gradhub::metrics::TelemetrySender> Authorize(
      const std::string& authorization) const {
    return gradhub::metrics::AuthorizeSender(auth, authorization);
  }

  gradhub::db::Pool pool;
  gradhub::api::Authenticator auth;
  gradhub::metrics::PostgresJobDirectory directory;
  gradhub::metrics::TrainingMetrics metrics;
  gradhub::metrics::TelemetryService service;
  DatabaseReadiness readiness;
  gradhub::PeriodicTask sweeper;
  gradhub::metrics::HttpEndpoint http;
};

// Keepalive both ways: trainers ping every 10 s (telemetry_client), so a dead server is noticed
// while a stream is idle; the server pings too, so a trainer that vanished frees its thread.
absl::StatusOr<std::unique_ptr<gradhub::GrpcServer>> StartGrpc(
    const MetricsConfig& config, std::shared_ptr<grpc::ServerCredentials> credentials,
    grpc::Service* service) {
  return gradhub::StartGrpcServer(
      {.address = config.host + ":" + std::to_string(config.grpc_port),
       .credentials = std::move(credentials),
       .max_idle_threads = kMaxIdleRpcThreads,
       .limits = config.server.grpc},
      [service](grpc::ServerBuilder& builder) {
        builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 30000);
        builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10000);
        builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 5000);
        builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
        builder.RegisterService(service);
      });
}

int Serve(const MetricsConfig& config) {
  auto credentials = gradhub::ServerCredentials(
      config.server.tls.cert_file, config.server.tls.key_file, config.server.tls.client_ca_file);
  if (!credentials.ok()) {
    std::cerr << "gradhub-metrics: " << credentials.status().message() << "\n";
    return 2;
  }
  const gradhub::ShutdownSignals signals;
  MetricsServer parts(config);
  auto server = StartGrpc(config, *std::move(credentials), &parts.service);
  if (!server.ok()) {
    std::cerr << "gradhub-metrics: " << server.status().message() << "\n";
    return 1;
  }
  parts.sweeper.Start();
  const absl::StatusOr<int> http_port =
      parts.http.Start(config.host, static_cast<int>(config.http_port));
  if (!http_port.ok()) {
    std::cerr << "gradhub-metrics: HTTP: " << http_port.status().message() << "\n";
    return 1;
  }
  // Lines a launcher can parse for the ports actually bound.
  std::cout << "gradhub-metrics: serving HTTP on port " << *http_port << std::endl;
  std::cout << "gradhub-metrics: serving gRPC on port " << (*server)->port() << std::endl;

  const int received = signals.Wait();
  std::cerr << "gradhub-metrics: signal " << received << ", shutting down\n";
  parts.sweeper.Stop();
  // Streams get the grace (MetricsConfig), then are cancelled.
  (*server)->Shutdown(config.server.shutdown_grace);
  parts.http.Stop();
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
  gradhub::HideSecretFlagValues(argc, argv, {"--admin-token", "--database-url"});
  if (!args.empty()) {
    std::cerr << flags.Usage();
    return 2;
  }
  return Serve(config);
}
