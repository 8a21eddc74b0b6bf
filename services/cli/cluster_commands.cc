#include "services/cli/cluster_commands.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "services/cli/client_config.h"
#include "services/cli/local_cluster.h"
#include "services/cli/local_process.h"
#include "services/common/tls/cluster_ca.h"

namespace gradhub::cli {
namespace {

// Every service a cluster may have, in start order, for `logs` when none is up.
constexpr const char* kServices[] = {"postgres", "api",    "checkpoint", "metrics",
                                     "node-a",   "node-b", "prometheus"};

int FailWith(Invocation& inv, const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kNotFound:
      return inv.Fail(kNotFound, "NOT_FOUND", std::string(status.message()));
    case absl::StatusCode::kFailedPrecondition:
      return inv.Fail(kConflict, "FAILED_PRECONDITION", std::string(status.message()));
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
      return inv.Fail(kUnavailable, "UNAVAILABLE", std::string(status.message()));
    default:
      return inv.Fail(kInternal, "INTERNAL", std::string(status.message()));
  }
}

std::string Endpoints(const ClusterProcess& process) {
  std::vector<std::string> parts;
  for (const auto& [kind, address] : process.endpoints) parts.push_back(kind + " " + address);
  return absl::StrJoin(parts, "  ");
}

// One line per service: name, pid, state, endpoints; the stopped ones named in the result.
std::vector<std::string> PrintServices(Invocation& inv, const ClusterRecord& record) {
  std::vector<std::string> stopped;
  inv.out() << absl::StrFormat("%-11s %-8s %-8s %s\n", "SERVICE", "PID", "STATE", "ENDPOINTS");
  for (const ClusterProcess& process : record.processes) {
    const bool running = IsRunning(record, process);
    if (!running) stopped.push_back(process.name);
    inv.out() << absl::StrFormat("%-11s %-8d %-8s %s\n", process.name, process.pid,
                                 running ? "running" : "STOPPED", Endpoints(process));
  }
  return stopped;
}

}  // namespace

int ClusterUpCommand(Invocation& inv) {
  LocalClusterOptions options = DefaultClusterOptions();
  std::vector<std::string> roots;
  inv.RepeatedFlag("data-root", &roots,
                   "Another directory whose files jobs may name, besides the examples' data and "
                   "<state>/data");
  bool insecure = false;
  inv.flags().Bool("insecure", "", &insecure,
                   "Plaintext everywhere, no certificates (default: TLS with the cluster's own "
                   "CA in <state>/tls, agents with client certificates)");
  int64_t api_replicas = 1;
  inv.flags().Int("api-replicas", "", &api_replicas,
                  "gradhub-api processes on the one database (1 to 16): api, api-2, ...; one "
                  "leads at a time, every one serves, agents and the client config name all");
  if (!inv.Parse(0, 0)) return inv.exit_code();
  if (api_replicas < 1 || api_replicas > kMaxApiReplicas) {
    return inv.UsageError(
        absl::StrCat("--api-replicas: ", api_replicas, " is not between 1 and ", kMaxApiReplicas));
  }
  options.api_replicas = static_cast<int>(api_replicas);
  options.tls = !insecure;
  for (const std::string& root : roots) {
    options.data_roots.push_back(std::filesystem::absolute(root).lexically_normal().string());
  }
  absl::StatusOr<UpResult> up = ClusterUp(options, inv.err());
  if (!up.ok()) return FailWith(inv, up.status());
  const std::vector<std::string> targets = absl::StrSplit(ApiTargets(up->record), ',');
  const size_t replicas = targets.size();
  if (up->already_up && replicas != static_cast<size_t>(options.api_replicas)) {
    inv.err() << "note: the cluster already up has " << replicas
              << " api replica(s), not --api-replicas " << options.api_replicas
              << ": `gradhub cluster down` first to change it\n";
  }
  inv.out() << "gradhub local cluster in " << options.state_dir
            << (up->already_up ? " (already up)" : "") << "\n";
  PrintServices(inv, up->record);
  inv.out() << "data roots: " << absl::StrJoin(options.data_roots, ":") << "\n"
            << "client config: " << ClientConfigPath()
            << " (the defaults of --server, --checkpoint-server, --token, --tls-ca)\n"
            << (up->record.tls_dir.empty()
                    ? std::string("TLS: off (--insecure)\n")
                    : "TLS: on; CA " + up->record.tls_dir + "/ca.pem (curl --cacert it)\n")
            << "admin token: " << options.state_dir << "/admin-token\n"
            << "try: gradhub submit -f deploy/examples/jobs/digits-mlp.yaml --watch\n"
            << "logs: gradhub cluster logs SERVICE; stop: gradhub cluster down\n";
  return kOk;
}

int ClusterCertsCommand(Invocation& inv) {
  std::string out, ca_dir, hosts, nodes;
  inv.flags()
      .String("out", "", &out, "Directory of the servers' and clients' files (required)")
      .String("ca-dir", "", &ca_dir,
              "Directory of the CA's certificate and key, kept apart from what servers mount; "
              "empty = --out")
      .String("hosts", "", &hosts,
              "Comma-separated host names or IPs the servers are reached at, besides localhost "
              "and 127.0.0.1 (e.g. the compose or Kubernetes service names)")
      .String("nodes", "", &nodes,
              "Comma-separated node names: a client certificate for each agent");
  if (!inv.Parse(0, 0)) return inv.exit_code();
  if (out.empty()) return inv.UsageError("--out: required");
  const tls::ClusterCertsOptions options{.out_dir = out,
                                         .ca_dir = ca_dir,
                                         .hosts = absl::StrSplit(hosts, ',', absl::SkipEmpty()),
                                         .nodes = absl::StrSplit(nodes, ',', absl::SkipEmpty())};
  absl::StatusOr<tls::ClusterCertFiles> files = tls::MakeClusterCerts(options);
  if (!files.ok()) {
    if (files.status().code() == absl::StatusCode::kInvalidArgument) {
      return inv.UsageError(std::string(files.status().message()));
    }
    return FailWith(inv, files.status());
  }
  inv.out() << (files->made_ca ? "made a CA: " : "kept the CA: ") << files->ca_key << "\n"
            << "trusted by clients (--tls-ca): " << files->ca_cert << "\n"
            << "servers (--tls-cert, --tls-key): " << files->server_cert << " " << files->server_key
            << "\n";
  for (const auto& [node, paths] : files->nodes) {
    inv.out() << "node " << node << " (agent --tls-cert, --tls-key): " << paths.cert << " "
              << paths.key << "\n";
  }
  return kOk;
}

int ClusterStatusCommand(Invocation& inv) {
  if (!inv.Parse(0, 0)) return inv.exit_code();
  const std::string state_dir = DefaultClusterOptions().state_dir;
  absl::StatusOr<std::optional<ClusterRecord>> record = ReadClusterRecord(state_dir);
  if (!record.ok()) return FailWith(inv, record.status());
  if (!record->has_value()) {
    return inv.Fail(kNotFound, "NOT_FOUND",
                    "no local cluster in " + state_dir + "; start one with `gradhub cluster up`");
  }
  inv.out() << "gradhub local cluster in " << state_dir << "\n";
  const std::vector<std::string> stopped = PrintServices(inv, **record);
  if (stopped.empty()) return kOk;
  return inv.Fail(kUnavailable, "UNAVAILABLE",
                  absl::StrCat(absl::StrJoin(stopped, ", "), " stopped (see `gradhub cluster logs ",
                               stopped[0], "`); `gradhub cluster down`, then `up`, restarts"));
}

int ClusterDownCommand(Invocation& inv) {
  if (!inv.Parse(0, 0)) return inv.exit_code();
  const std::string state_dir = DefaultClusterOptions().state_dir;
  const absl::Status down = ClusterDown(state_dir, inv.err());
  if (!down.ok()) return FailWith(inv, down);
  inv.out() << "gradhub local cluster in " << state_dir << " is down\n";
  return kOk;
}

int ClusterLogsCommand(Invocation& inv) {
  int64_t tail = 0;
  inv.flags().Int("tail", "", &tail, "Only the last N lines of each log; 0 = all of it");
  if (!inv.Parse(0, 1)) return inv.exit_code();
  if (tail < 0) return inv.UsageError("--tail: must be 0 or more");
  const std::string state_dir = DefaultClusterOptions().state_dir;
  std::vector<std::string> services(std::begin(kServices), std::end(kServices));
  if (!inv.positional().empty()) services = {inv.positional()[0]};
  bool any = false;
  for (const std::string& service : services) {
    const std::string path = ServiceLogPath(state_dir, service);
    std::ifstream in(path, std::ios::binary);
    if (!in) continue;
    any = true;
    if (inv.positional().empty()) inv.out() << "==> " << service << ": " << path << " <==\n";
    if (tail > 0) {
      inv.out() << TailOfFile(path, static_cast<int>(tail));
    } else {
      inv.out() << in.rdbuf();
    }
  }
  inv.out().flush();
  if (any) return kOk;
  return inv.Fail(kNotFound, "NOT_FOUND",
                  inv.positional().empty()
                      ? "no logs in " + state_dir + "/logs"
                      : absl::StrCat("no log of '", inv.positional()[0],
                                     "' (services: ", absl::StrJoin(kServices, ", "), ")"));
}

}  // namespace gradhub::cli
