#pragma once

#include <string>

#include "absl/time/time.h"
#include "services/common/flags.h"
#include "services/common/server_settings.h"

namespace gradhub::metrics {

// Every setting of gradhub-metrics, with its flag, environment variable and default: those
// every server shares (server_settings.h), then its own.
struct MetricsConfig {
  // Streams stay open for a trainer's whole life: a short grace, then they are cancelled and
  // their reporters reconnect to whichever instance comes next.
  ServerSettings server{.database = {.connections = 4}, .shutdown_grace = absl::Seconds(2)};
  std::string host = "0.0.0.0";
  int64_t grpc_port = 7072;
  int64_t http_port = 9464;
  absl::Duration finished_job_ttl = absl::Minutes(10);
  absl::Duration idle_job_ttl = absl::Hours(1);
  int64_t max_jobs = 200;
  absl::Duration job_check_interval = absl::Seconds(15);

  void Register(Flags& flags) {
    // Jobs' states and tokens are read in the api's database; this server does not migrate.
    server.Register(flags, {.connections_env = "GRADHUB_METRICS_DATABASE_CONNECTIONS",
                            .migrates = false,
                            .tls_effect = "gRPC and HTTP serve TLS only"});
    flags.String("host", "GRADHUB_METRICS_HOST", &host, "Address gRPC and HTTP listen on");
    flags.Int("grpc-port", "GRADHUB_METRICS_GRPC_PORT", &grpc_port,
              "Port of TelemetryService (trainers); 0 picks a free one");
    flags.Int(
        "http-port", "GRADHUB_METRICS_HTTP_PORT", &http_port,
        "Port of /metrics, /healthz, /readyz and POST /v1/telemetry (script ranks); 0 picks a "
        "free one");
    flags.Duration("finished-job-ttl", "GRADHUB_METRICS_FINISHED_JOB_TTL", &finished_job_ttl,
                   "How long a job's series stay after the job ended");
    flags.Duration("idle-job-ttl", "GRADHUB_METRICS_IDLE_JOB_TTL", &idle_job_ttl,
                   "A job without telemetry for this long loses its series, whatever its state");
    flags.Int("max-jobs", "GRADHUB_METRICS_MAX_JOBS", &max_jobs,
              "Most jobs with series at once; telemetry of further jobs is refused and counted "
              "in gradhub_telemetry_dropped_total{reason=\"job_limit\"}");
    flags.Duration("job-check-interval", "GRADHUB_METRICS_JOB_CHECK_INTERVAL", &job_check_interval,
                   "How often the states of jobs with series are read from the database");
  }
};

}  // namespace gradhub::metrics
