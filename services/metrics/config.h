#pragma once

#include <string>

#include "absl/time/time.h"
#include "services/common/db/settings.h"
#include "services/common/flags.h"

namespace gradhub::metrics {

// Every setting of gradhub-metrics, with its flag, environment variable and default.
struct MetricsConfig {
  db::DatabaseSettings database{.connections = 4};
  std::string host = "0.0.0.0";
  int64_t grpc_port = 7072;
  int64_t http_port = 9464;
  std::string admin_token;
  absl::Duration finished_job_ttl = absl::Minutes(10);
  absl::Duration idle_job_ttl = absl::Hours(1);
  int64_t max_jobs = 200;
  absl::Duration job_check_interval = absl::Seconds(15);
  absl::Duration shutdown_grace = absl::Seconds(2);
  std::string tls_cert_file;
  std::string tls_key_file;

  void Register(Flags& flags) {
    // Jobs' states and tokens are read in the api's database; this server does not migrate.
    database.Register(flags, "GRADHUB_METRICS_DATABASE_CONNECTIONS", /*migrates=*/false);
    flags.String("host", "GRADHUB_METRICS_HOST", &host, "Address gRPC and HTTP listen on");
    flags.Int("grpc-port", "GRADHUB_METRICS_GRPC_PORT", &grpc_port,
              "Port of TelemetryService (trainers); 0 picks a free one");
    flags.Int("http-port", "GRADHUB_METRICS_HTTP_PORT", &http_port,
              "Port of /metrics, /healthz and /readyz; 0 picks a free one");
    flags.String("admin-token", "GRADHUB_ADMIN_TOKEN", &admin_token,
                 "Bearer token with admin rights (may report for any job); empty = none");
    flags.Duration("finished-job-ttl", "GRADHUB_METRICS_FINISHED_JOB_TTL", &finished_job_ttl,
                   "How long a job's series stay after the job ended");
    flags.Duration("idle-job-ttl", "GRADHUB_METRICS_IDLE_JOB_TTL", &idle_job_ttl,
                   "A job without telemetry for this long loses its series, whatever its state");
    flags.Int("max-jobs", "GRADHUB_METRICS_MAX_JOBS", &max_jobs,
              "Most jobs with series at once; telemetry of further jobs is refused and counted "
              "in gradhub_telemetry_dropped_total{reason=\"job_limit\"}");
    flags.Duration("job-check-interval", "GRADHUB_METRICS_JOB_CHECK_INTERVAL", &job_check_interval,
                   "How often the states of jobs with series are read from the database");
    flags.Duration("shutdown-grace", "GRADHUB_SHUTDOWN_GRACE", &shutdown_grace,
                   "On SIGTERM, how long open streams may finish before they are cancelled");
    flags.String("tls-cert", "GRADHUB_TLS_CERT", &tls_cert_file,
                 "PEM certificate chain; with --tls-key, gRPC serves TLS only (HTTP stays plain)");
    flags.String("tls-key", "GRADHUB_TLS_KEY", &tls_key_file, "PEM private key of --tls-cert");
  }
};

}  // namespace gradhub::metrics
