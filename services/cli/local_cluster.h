// `gradhub cluster`: the whole platform as background processes on this machine, the same
// topology as docker-compose (deploy/local/cluster.sh shows it as a script): a private
// PostgreSQL under the state directory (initdb once, reused after) unless
// $GRADHUB_DATABASE_URL names one, gradhub-api, gradhub-checkpoint, gradhub-metrics, two
// agents with 2 CPU slots each, and Prometheus when it is installed; all on loopback, each
// with its log file under <state>/logs. TLS by default, with a CA of the cluster's own under
// the state directory (cluster_tls.h): the servers serve only TLS, the agents present their
// node's client certificate (required by the api), the CLI's client config trusts the CA. What was
// started is recorded in <state>/cluster.json, so that `down` stops exactly that, and `status` can
// tell a crashed service from a running one.
//
// Not thread-safe; one CLI process at a time works on a state directory (`up` and `down`
// hold <state>/lock).
#pragma once

#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace gradhub::cli {

struct LocalClusterOptions {
  std::string state_dir;
  // Where gradhub-api, gradhub-agent, ... are.
  std::string bin_dir;
  // "" = a private PostgreSQL under state_dir.
  std::string database_url;
  // Where initdb, pg_ctl and postgres are.
  std::string postgres_bin;
  // What jobs may read on the agents (--data-root); each must exist.
  std::vector<std::string> data_roots;
  // How long each service may take to say it is ready.
  absl::Duration ready_timeout = absl::Seconds(60);
  // TLS everywhere with the cluster's own CA (cluster_tls.h); false = plaintext (--insecure).
  bool tls = true;
  // gradhub-api processes on the one database (--api-replicas): "api", "api-2", ...; the
  // agents and the client config get every replica's gRPC address, comma-separated.
  int api_replicas = 1;
};

// The most --api-replicas `cluster up` starts (each is a process with its own pool).
inline constexpr int kMaxApiReplicas = 16;

// This machine's defaults: StateDir(), $GRADHUB_BIN or this binary's directory,
// $GRADHUB_DATABASE_URL, `pg_config --bindir` or Debian's PostgreSQL 15, and as data roots
// those of the examples that exist: scikit-learn's datasets and their descriptions (Debian's
// python3-sklearn), the source tree's deploy/examples, and <state>/data.
LocalClusterOptions DefaultClusterOptions();

// One process the cluster started.
struct ClusterProcess {
  std::string name;  // postgres, api (api-2, ...), checkpoint, metrics, node-a, node-b, prometheus
  int pid = 0;
  std::string binary;  // the argv[0] it was started with
  std::string log;
  // (kind, address): ("gRPC", "127.0.0.1:7070"), ("REST", "http://127.0.0.1:8080"), ...
  std::vector<std::pair<std::string, std::string>> endpoints;
};

// <state>/cluster.json.
struct ClusterRecord {
  std::string state_dir;
  std::vector<ClusterProcess> processes;  // in the order they were started
  std::string postgres_data;              // "" = an external database
  std::string postgres_bin;
  std::string postgres_user;  // whom PostgreSQL runs as; "" = as ourselves
  std::string tls_dir;        // the certificates (cluster_tls.h); "" = plaintext
};

// What `up` did: started the cluster, or found it already up.
struct UpResult {
  ClusterRecord record;
  bool already_up = false;
};

// Starts the cluster, or finds it already up; writes the client config (client_config.h).
// On failure stops whatever it had started. Progress notes go to `progress`.
absl::StatusOr<UpResult> ClusterUp(const LocalClusterOptions& options, std::ostream& progress);

// Stops what the record in `state_dir` names (each only if it is still the process started,
// see IsRunning), PostgreSQL through pg_ctl; removes the record and the client config.
// NOT_FOUND when no cluster is recorded there.
absl::Status ClusterDown(const std::string& state_dir, std::ostream& progress);

// The record in `state_dir`; nullopt when there is none.
absl::StatusOr<std::optional<ClusterRecord>> ReadClusterRecord(const std::string& state_dir);

// Whether `process` of `record` still runs as the process that was started.
bool IsRunning(const ClusterRecord& record, const ClusterProcess& process);

// Every api replica's gRPC address, comma-separated, in the order they were started: what
// agents and clients are given as --server.
std::string ApiTargets(const ClusterRecord& record);

// Where the log of `service` is (whether or not the cluster is up).
std::string ServiceLogPath(const std::string& state_dir, const std::string& service);

}  // namespace gradhub::cli
