#include "services/cli/local_cluster.h"

#include <fcntl.h>
#include <pwd.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>
#include <tuple>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "services/cli/client_config.h"
#include "services/cli/cluster_tls.h"
#include "services/cli/local_process.h"
#include "services/common/status_macros.h"

namespace gradhub::cli {
namespace {

namespace fs = std::filesystem;

constexpr char kPostgres[] = "postgres";
// As root, PostgreSQL (which refuses root) runs as this user, as deploy/local/cluster.sh does.
constexpr char kPostgresUser[] = "nobody";
constexpr char kTenant[] = "local";
constexpr const char* kAgents[] = {"node-a", "node-b"};
constexpr int kSlotsPerAgent = 2;
// Agents stop their ranks on SIGTERM (SIGKILL after their 10 s --stop-grace) and then ship
// the rest of the ranks' output (5 s), so `down` waits that long before SIGKILL.
constexpr absl::Duration kStopTimeout = absl::Seconds(30);

std::string RecordPath(const std::string& state_dir) { return state_dir + "/cluster.json"; }

std::string ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string FirstLine(const std::string& text) {
  return std::string(absl::StripAsciiWhitespace(text.substr(0, text.find('\n'))));
}

nlohmann::json ToJson(const ClusterRecord& record) {
  nlohmann::json processes = nlohmann::json::array();
  for (const ClusterProcess& process : record.processes) {
    nlohmann::json endpoints = nlohmann::json::array();
    for (const auto& [kind, address] : process.endpoints) endpoints.push_back({kind, address});
    processes.push_back({{"name", process.name},
                         {"pid", process.pid},
                         {"binary", process.binary},
                         {"log", process.log},
                         {"endpoints", endpoints}});
  }
  return {{"stateDir", record.state_dir},         {"processes", processes},
          {"postgresData", record.postgres_data}, {"postgresBin", record.postgres_bin},
          {"postgresUser", record.postgres_user}, {"tlsDir", record.tls_dir}};
}

ClusterRecord FromJson(const nlohmann::json& json) {
  ClusterRecord record;
  record.state_dir = json.at("stateDir").get<std::string>();
  record.postgres_data = json.at("postgresData").get<std::string>();
  record.postgres_bin = json.at("postgresBin").get<std::string>();
  record.postgres_user = json.at("postgresUser").get<std::string>();
  record.tls_dir = json.value("tlsDir", "");  // absent in the records of earlier versions
  for (const nlohmann::json& item : json.at("processes")) {
    ClusterProcess process{item.at("name").get<std::string>(),
                           item.at("pid").get<int>(),
                           item.at("binary").get<std::string>(),
                           item.at("log").get<std::string>(),
                           {}};
    for (const nlohmann::json& endpoint : item.at("endpoints")) {
      process.endpoints.emplace_back(endpoint.at(0).get<std::string>(),
                                     endpoint.at(1).get<std::string>());
    }
    record.processes.push_back(std::move(process));
  }
  return record;
}

// Atomically, so that a `status` running alongside `up` reads a whole record.
absl::Status WriteRecord(const ClusterRecord& record) {
  const std::string path = RecordPath(record.state_dir), temporary = path + ".tmp";
  const mode_t old_mask = umask(077);  // it holds the database URL, password included
  std::ofstream(temporary, std::ios::trunc) << ToJson(record).dump(2) << "\n";
  umask(old_mask);
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("cannot write ", path));
  }
  return absl::OkStatus();
}

const ClusterProcess* Find(const ClusterRecord& record, const std::string& name) {
  for (const ClusterProcess& process : record.processes) {
    if (process.name == name) return &process;
  }
  return nullptr;
}

std::string Endpoint(const ClusterRecord& record, const std::string& name,
                     const std::string& kind) {
  if (const ClusterProcess* process = Find(record, name)) {
    for (const auto& [k, address] : process->endpoints) {
      if (k == kind) return address;
    }
  }
  return "";
}

// ---------------------------------------------------------------------------------------------
// The state directory.

// PostgreSQL and, as root, the ranks run as other users: they must be able to enter it.
absl::Status PrepareStateDir(const std::string& dir) {
  for (const char* sub : {"/logs", "/data"}) {
    std::error_code error;
    fs::create_directories(dir + sub, error);
    if (error) {
      return absl::InternalError(absl::StrCat("cannot create ", dir, sub, ": ", error.message()));
    }
  }
  if (geteuid() != 0) return absl::OkStatus();
  chmod(dir.c_str(), 0711);
  chmod((dir + "/data").c_str(), 0755);
  for (fs::path path = fs::absolute(dir).parent_path(); !path.empty(); path = path.parent_path()) {
    struct stat info {};
    if (stat(path.c_str(), &info) == 0 && (info.st_mode & S_IXOTH) == 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("PostgreSQL and the ranks run as unprivileged users, who cannot enter ",
                       path.string(), absl::StrFormat(" (mode %o)", info.st_mode & 0777),
                       "; set GRADHUB_STATE_DIR to a "
                       "directory they can reach"));
    }
    if (path == path.root_path()) break;
  }
  return absl::OkStatus();
}

// Held until this process exits: one `up` or `down` at a time per state directory.
absl::Status LockStateDir(const std::string& dir) {
  const std::string path = dir + "/lock";
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0 || flock(fd, LOCK_EX) != 0) {
    return absl::InternalError(absl::StrCat("cannot lock ", path));
  }
  return absl::OkStatus();
}

// The environment of every process of the cluster.
std::map<std::string, std::string> ServiceEnv(const std::string& state_dir,
                                              const std::string& database_url,
                                              const std::string& admin_token) {
  // Passed in the environment, not as flags, so that other users do not read them in `ps`.
  return {{kClusterMarker, state_dir},
          {"GRADHUB_DATABASE_URL", database_url},
          {"GRADHUB_ADMIN_TOKEN", admin_token}};
}

// ---------------------------------------------------------------------------------------------
// PostgreSQL, private to the state directory.

// `argv` as the PostgreSQL user: runuser as root, directly otherwise.
ProcessSpec AsPostgresUser(const ClusterRecord& record, std::vector<std::string> argv) {
  if (!record.postgres_user.empty()) {
    argv.insert(argv.begin(), {"/usr/sbin/runuser", "-u", record.postgres_user, "--"});
  }
  return ProcessSpec{std::move(argv), {{kClusterMarker, record.state_dir}}};
}

// Runs a PostgreSQL tool; its output goes to <state>/postgres/pg_ctl.log.
absl::Status RunPostgresTool(const ClusterRecord& record, std::vector<std::string> argv) {
  const std::string tool = fs::path(argv[0]).filename().string();
  const std::string log = fs::path(record.postgres_data).parent_path().string() + "/pg_ctl.log";
  GRADHUB_ASSIGN_OR_RETURN(const int code,
                           RunToCompletion(AsPostgresUser(record, std::move(argv)), log, log));
  if (code != 0) {
    return absl::InternalError(absl::StrCat(tool, " exited with ", code, "; the end of ", log,
                                            ":\n", TailOfFile(log, 15)));
  }
  return absl::OkStatus();
}

// The pid in <data>/postmaster.pid, 0 when there is none.
int PostmasterPid(const ClusterRecord& record) {
  int pid = 0;
  const std::string text = ReadText(record.postgres_data + "/postmaster.pid");
  return absl::SimpleAtoi(FirstLine(text), &pid) ? pid : 0;
}

// Creates the database cluster on the first `up` of this state directory: true when it did
// (the database is new, and tokens of an earlier one are void).
absl::StatusOr<bool> InitDatabaseOnce(const ClusterRecord& record, const std::string& password) {
  if (fs::exists(record.postgres_data + "/PG_VERSION")) return false;
  const std::string dir = fs::path(record.postgres_data).parent_path().string();
  std::error_code error;
  fs::remove_all(record.postgres_data, error);  // what an interrupted initdb left
  fs::create_directories(dir, error);
  if (!record.postgres_user.empty()) {
    const passwd* user = getpwnam(record.postgres_user.c_str());
    if (user == nullptr || chown(dir.c_str(), user->pw_uid, user->pw_gid) != 0) {
      return absl::InternalError(absl::StrCat("cannot give ", dir, " to ", record.postgres_user));
    }
  }
  // scram-sha-256, never trust: ranks run tenant code on this host and can reach the port.
  const std::string password_file = dir + "/.initdb-password";
  {
    const mode_t old_mask = umask(077);
    std::ofstream(password_file, std::ios::trunc) << password << "\n";
    umask(old_mask);
  }
  if (const passwd* user =
          record.postgres_user.empty() ? nullptr : getpwnam(record.postgres_user.c_str());
      user != nullptr && chown(password_file.c_str(), user->pw_uid, user->pw_gid) != 0) {
    return absl::InternalError(
        absl::StrCat("cannot give ", password_file, " to ", record.postgres_user));
  }
  const absl::Status status =
      RunPostgresTool(record, {record.postgres_bin + "/initdb", "-D", record.postgres_data, "-U",
                               "gradhub", "-A", "scram-sha-256", "--pwfile=" + password_file});
  std::remove(password_file.c_str());
  GRADHUB_RETURN_IF_ERROR(status);
  return true;
}

// Starts PostgreSQL on a free loopback port (its socket in its own directory), records it and
// returns its URL.
absl::StatusOr<std::string> StartPostgres(ClusterRecord* record, const std::string& password) {
  GRADHUB_ASSIGN_OR_RETURN(const int port, FreeLoopbackPort());
  const std::string dir = fs::path(record->postgres_data).parent_path().string();
  const std::string log = dir + "/postgres.log";
  GRADHUB_RETURN_IF_ERROR(RunPostgresTool(
      *record,
      {record->postgres_bin + "/pg_ctl", "-D", record->postgres_data, "-l", log, "-w", "-o",
       absl::StrCat("-p ", port, " -k '", dir, "' -c listen_addresses=127.0.0.1"), "start"}));
  const std::string url =
      absl::StrCat("postgresql://gradhub:", password, "@127.0.0.1:", port, "/postgres");
  record->processes.push_back(
      {kPostgres, PostmasterPid(*record), record->postgres_bin + "/postgres", log, {{"URL", url}}});
  GRADHUB_RETURN_IF_ERROR(WriteRecord(*record));
  return url;
}

bool IsPostgresRunning(const ClusterRecord& record) {
  // Its own pid file names the postmaster of our data directory (a stale one, after a crash,
  // names a pid that is gone or no longer a postgres).
  const int pid = record.postgres_data.empty() ? 0 : PostmasterPid(record);
  const std::vector<std::string> command = CommandLine(pid);
  return pid > 0 && IsAlive(pid) && !command.empty() &&
         fs::path(command[0]).filename() == "postgres";
}

absl::Status StopPostgres(const ClusterRecord& record, std::ostream& progress) {
  if (!IsPostgresRunning(record)) return absl::OkStatus();
  GRADHUB_RETURN_IF_ERROR(RunPostgresTool(
      record,
      {record.postgres_bin + "/pg_ctl", "-D", record.postgres_data, "-m", "fast", "-w", "stop"}));
  progress << "stopped postgres\n";
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// Tokens.

struct ClusterTokens {
  std::string admin, tenant, node;
};

// The first line `gradhub-api COMMAND...` prints.
absl::StatusOr<std::string> ApiOutput(const LocalClusterOptions& options,
                                      const std::map<std::string, std::string>& env,
                                      std::vector<std::string> command) {
  command.insert(command.begin(), options.bin_dir + "/gradhub-api");
  const std::string out = options.state_dir + "/.api-command.out";
  const std::string err = options.state_dir + "/logs/api-commands.log";
  GRADHUB_ASSIGN_OR_RETURN(const int code, RunToCompletion({command, env}, out, err));
  const std::string text = ReadText(out);
  std::remove(out.c_str());
  if (code != 0) {
    return absl::InternalError(absl::StrCat("`gradhub-api ",
                                            absl::StrJoin(command.begin() + 1, command.end(), " "),
                                            "` exited with ", code, ": ", TailOfFile(err, 5)));
  }
  return FirstLine(text);
}

// A secret kept in <state>/NAME (0600), made by `make` when there is none.
template <typename Make>
absl::StatusOr<std::string> KeptSecret(const std::string& state_dir, const std::string& name,
                                       Make make) {
  const std::string path = state_dir + "/" + name;
  if (std::string kept = FirstLine(ReadText(path)); !kept.empty()) return kept;
  GRADHUB_ASSIGN_OR_RETURN(std::string secret, make());
  const mode_t old_mask = umask(077);
  std::ofstream(path, std::ios::trunc) << secret << "\n";
  umask(old_mask);
  return secret;
}

// The admin token is ours, made once; the tenant "local" is made once per database (its token
// is shown only once, so it is kept); a node token is made on every `up`.
absl::StatusOr<ClusterTokens> MakeTokens(const LocalClusterOptions& options,
                                         const std::string& database_url, bool new_database) {
  ClusterTokens tokens;
  GRADHUB_ASSIGN_OR_RETURN(tokens.admin, KeptSecret(options.state_dir, "admin-token", [] {
                             return absl::StatusOr<std::string>("ghadmin_" + RandomHex(24));
                           }));
  const auto env = ServiceEnv(options.state_dir, database_url, tokens.admin);
  if (new_database) std::remove((options.state_dir + "/tenant-token").c_str());
  GRADHUB_ASSIGN_OR_RETURN(tokens.tenant, KeptSecret(options.state_dir, "tenant-token", [&] {
                             return ApiOutput(options, env, {"create-tenant", kTenant});
                           }));
  GRADHUB_ASSIGN_OR_RETURN(tokens.node, ApiOutput(options, env, {"create-node-token"}));
  return tokens;
}

// ---------------------------------------------------------------------------------------------
// The services.

// One service to start: its command, and the log lines that say it is ready. Each ready line
// with a port ("serving gRPC on port N") gives an endpoint of `kind`.
struct Launch {
  std::string name;
  ProcessSpec spec;
  struct Ready {
    std::string marker;
    std::string kind;    // "" = no endpoint
    std::string prefix;  // before the port: "127.0.0.1:", "http://127.0.0.1:", "https://..."
    std::string suffix;  // after it: "" or "/metrics"
  };
  std::vector<Ready> ready;
};

// 1. Start it detached with its log; 2. record it at once, so that `down` finds it even if
//    this `up` goes no further; 3. wait for its ready lines; 4. record its endpoints.
absl::Status StartService(const LocalClusterOptions& options, Launch launch,
                          ClusterRecord* record) {
  const std::string log = ServiceLogPath(options.state_dir, launch.name);
  GRADHUB_ASSIGN_OR_RETURN(const pid_t pid, SpawnDetached(launch.spec, log));
  record->processes.push_back({launch.name, pid, launch.spec.argv[0], log, {}});
  GRADHUB_RETURN_IF_ERROR(WriteRecord(*record));
  std::vector<std::string> markers;
  for (const Launch::Ready& ready : launch.ready) {
    // One port may be recorded as several endpoints (metrics' HTTP base and its /metrics).
    if (std::find(markers.begin(), markers.end(), ready.marker) == markers.end()) {
      markers.push_back(ready.marker);
    }
  }
  absl::StatusOr<std::map<std::string, std::string>> lines =
      WaitForLogLines(pid, log, markers, options.ready_timeout);
  if (!lines.ok()) {
    return absl::Status(lines.status().code(),
                        absl::StrCat(launch.name, ": ", lines.status().message()));
  }
  for (const Launch::Ready& ready : launch.ready) {
    if (ready.kind.empty()) continue;
    const std::string port = FirstLine((*lines)[ready.marker]);
    record->processes.back().endpoints.emplace_back(ready.kind, ready.prefix + port + ready.suffix);
  }
  return WriteRecord(*record);
}

// `url_scheme`: "" for a gRPC endpoint (host:port), else "http://" or "https://".
Launch::Ready Port(const std::string& protocol, const std::string& kind,
                   const std::string& url_scheme = "", const std::string& suffix = "") {
  return {"serving " + protocol + " on port ", kind, url_scheme + "127.0.0.1:", suffix};
}

// `argv` with `more` after its first element (the binary), before the flags of its own.
std::vector<std::string> WithFlags(std::vector<std::string> argv,
                                   const std::vector<std::string>& more) {
  argv.insert(argv.begin() + 1, more.begin(), more.end());
  return argv;
}

// The name of api replica `index` (from 0): "api" for the first, as with one replica.
std::string ApiReplicaName(int index) {
  return index == 0 ? std::string("api") : absl::StrCat("api-", index + 1);
}

// options.api_replicas gradhub-api processes on the one database. One listens where the
// kernel puts it; several get their gRPC ports chosen first, so that each can hand its ranks
// every replica's address as the rendezvous store's (its keys are in PostgreSQL).
absl::Status StartApis(const LocalClusterOptions& options,
                       const std::map<std::string, std::string>& env, const ClusterTls& tls,
                       ClusterRecord* record) {
  std::vector<std::string> grpc = {"127.0.0.1:0"};
  if (options.api_replicas > 1) {
    grpc.clear();
    for (int i = 0; i < options.api_replicas; ++i) {
      GRADHUB_ASSIGN_OR_RETURN(const int port, FreeLoopbackPort());
      grpc.push_back(absl::StrCat("127.0.0.1:", port));
    }
  }
  for (int i = 0; i < static_cast<int>(grpc.size()); ++i) {
    std::vector<std::string> argv = {options.bin_dir + "/gradhub-api",
                                     "--grpc-address",
                                     grpc[i],
                                     "--http-host",
                                     "127.0.0.1",
                                     "--http-port",
                                     "0"};
    if (grpc.size() > 1) argv.insert(argv.end(), {"--store-address", absl::StrJoin(grpc, ",")});
    argv.push_back("serve");
    GRADHUB_RETURN_IF_ERROR(
        StartService(options,
                     {ApiReplicaName(i),
                      {WithFlags(std::move(argv), tls.ApiArgs()), env},
                      {Port("gRPC", "gRPC"), Port("REST", "REST", tls.url_scheme())}},
                     record));
  }
  return absl::OkStatus();
}

// gradhub-api (its replicas), gradhub-checkpoint and gradhub-metrics, on loopback ports.
absl::Status StartServers(const LocalClusterOptions& options,
                          const std::map<std::string, std::string>& env, const ClusterTls& tls,
                          ClusterRecord* record) {
  const std::string& bin = options.bin_dir;
  const std::string rest = tls.url_scheme();
  GRADHUB_RETURN_IF_ERROR(StartApis(options, env, tls, record));
  GRADHUB_RETURN_IF_ERROR(StartService(
      options,
      {"checkpoint",
       {WithFlags(
            {bin + "/gradhub-checkpoint", "--grpc-host", "127.0.0.1", "--grpc-port", "0",
             "--http-host", "127.0.0.1", "--http-port", "0", "--data-dir",
             options.state_dir + "/checkpoint-store",
             // Encryption at rest: the master key beside the blobs' directory, made on first `up`.
             "--master-key-file", options.state_dir + "/checkpoint-master.key",
             "--create-master-key"},
            tls.ServerArgs()),
        env},
       {Port("gRPC", "gRPC"), Port("REST", "REST", rest)}},
      record));
  return StartService(options,
                      {"metrics",
                       {WithFlags({bin + "/gradhub-metrics", "--host", "127.0.0.1", "--grpc-port",
                                   "0", "--http-port", "0"},
                                  tls.ServerArgs()),
                        env},
                       {Port("gRPC", "gRPC"), Port("HTTP", "HTTP", rest),
                        Port("HTTP", "Prometheus", rest, "/metrics")}},
                      record);
}

// Two agents of kSlotsPerAgent CPU slots, with no shared disk (each keeps only a cache of
// checkpoints); ready once registered with the api.
absl::Status StartAgents(const LocalClusterOptions& options, std::map<std::string, std::string> env,
                         const std::string& node_token, const ClusterTls& tls,
                         ClusterRecord* record) {
  env["GRADHUB_NODE_TOKEN"] = node_token;
  // Both agents are on this machine: each its own MASTER_PORT range.
  int master_port_base = 29500;
  for (const char* node : kAgents) {
    std::vector<std::string> argv = {options.bin_dir + "/gradhub-agent",
                                     "--server",
                                     ApiTargets(*record),
                                     "--name",
                                     node,
                                     "--slots",
                                     absl::StrCat(kSlotsPerAgent),
                                     "--work-dir",
                                     options.state_dir + "/nodes/" + node,
                                     "--checkpoint-server",
                                     Endpoint(*record, "checkpoint", "gRPC"),
                                     "--checkpoint-url",
                                     Endpoint(*record, "checkpoint", "REST"),
                                     "--master-port-base",
                                     absl::StrCat(master_port_base),
                                     "--metrics-server",
                                     Endpoint(*record, "metrics", "gRPC"),
                                     "--metrics-url",
                                     Endpoint(*record, "metrics", "HTTP"),
                                     "--trainer",
                                     options.bin_dir + "/gradhub-trainer"};
    for (const std::string& root : options.data_roots) {
      argv.insert(argv.end(), {"--data-root", root});
    }
    GRADHUB_RETURN_IF_ERROR(StartService(options,
                                         {node,
                                          {WithFlags(std::move(argv), tls.AgentArgs(node)), env},
                                          {{"gradhub-agent: registered as", "", "", ""}}},
                                         record));
    record->processes.back().endpoints.emplace_back("CPU slots", absl::StrCat(kSlotsPerAgent));
    master_port_base += kSlotsPerAgent;
  }
  return absl::OkStatus();
}

// The first executable `name` on $PATH; "" when there is none.
std::string FindOnPath(const std::string& name) {
  const char* path = std::getenv("PATH");
  for (absl::string_view dir : absl::StrSplit(path == nullptr ? "" : path, ':')) {
    const std::string candidate = absl::StrCat(dir.empty() ? "." : dir, "/", name);
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

// Prometheus, when installed, scraping the three servers every 5 s.
absl::Status StartPrometheus(const LocalClusterOptions& options,
                             const std::map<std::string, std::string>& env, const ClusterTls& tls,
                             ClusterRecord* record) {
  const std::string binary = FindOnPath("prometheus");
  if (binary.empty()) return absl::OkStatus();
  const std::string dir = options.state_dir + "/prometheus";
  std::error_code error;
  fs::create_directories(dir + "/data", error);
  std::string config = "global:\n  scrape_interval: 5s\nscrape_configs:\n";
  for (const auto& [job, service, kind] :
       {std::tuple{"gradhub-api", "api", "REST"},
        std::tuple{"gradhub-checkpoint", "checkpoint", "REST"},
        std::tuple{"gradhub-metrics", "metrics", "Prometheus"}}) {
    // Every replica of the service: api, api-2, ...
    std::vector<std::string> targets;
    for (const ClusterProcess& process : record->processes) {
      if (process.name != service && !absl::StartsWith(process.name, absl::StrCat(service, "-"))) {
        continue;
      }
      std::string target = Endpoint(*record, process.name, kind);
      target = target.substr(target.find("//") + 2);
      targets.push_back(target.substr(0, target.find('/')));
    }
    absl::StrAppend(&config, "  - job_name: ", job, "\n", tls.PrometheusScrapeOptions(),
                    "    static_configs:\n      - targets: ['", absl::StrJoin(targets, "', '"),
                    "']\n");
  }
  std::ofstream(dir + "/prometheus.yml", std::ios::trunc) << config;
  GRADHUB_ASSIGN_OR_RETURN(const int port, FreeLoopbackPort());
  GRADHUB_RETURN_IF_ERROR(StartService(
      options,
      {"prometheus",
       {{binary, "--config.file=" + dir + "/prometheus.yml", "--storage.tsdb.path=" + dir + "/data",
         absl::StrCat("--web.listen-address=127.0.0.1:", port)},
        env},
       {{"Server is ready to receive web requests", "", "", ""}}},
      record));
  record->processes.back().endpoints.emplace_back("UI", absl::StrCat("http://127.0.0.1:", port));
  return WriteRecord(*record);
}

// ---------------------------------------------------------------------------------------------
// Up and down.

// The start order, each step waiting for the one before: 1. PostgreSQL (initdb the first
// time); 2. the schema; 3. the tokens and the certificates; 4. api, checkpoint, metrics; 5. the
// agents, which need all three; 6. Prometheus, which scrapes them.
absl::StatusOr<ClusterTokens> StartAll(const LocalClusterOptions& options, ClusterRecord* record,
                                       std::ostream& progress) {
  std::string url = options.database_url;
  bool new_database = false;
  if (url.empty()) {
    record->postgres_data = options.state_dir + "/postgres/data";
    record->postgres_bin = options.postgres_bin;
    record->postgres_user = geteuid() == 0 ? kPostgresUser : "";
    GRADHUB_ASSIGN_OR_RETURN(const std::string password,
                             KeptSecret(options.state_dir, "database-password",
                                        [] { return absl::StatusOr<std::string>(RandomHex(24)); }));
    GRADHUB_ASSIGN_OR_RETURN(new_database, InitDatabaseOnce(*record, password));
    if (new_database) progress << "created a database in " << record->postgres_data << "\n";
    GRADHUB_ASSIGN_OR_RETURN(url, StartPostgres(record, password));
    progress << "started postgres\n";
  }
  GRADHUB_RETURN_IF_ERROR(
      ApiOutput(options, ServiceEnv(options.state_dir, url, ""), {"migrate"}).status());
  GRADHUB_ASSIGN_OR_RETURN(ClusterTokens tokens, MakeTokens(options, url, new_database));
  GRADHUB_ASSIGN_OR_RETURN(
      const ClusterTls tls,
      PrepareClusterTls(options.state_dir, options.tls, {std::begin(kAgents), std::end(kAgents)}));
  record->tls_dir = tls.dir();
  const auto env = ServiceEnv(options.state_dir, url, tokens.admin);
  GRADHUB_RETURN_IF_ERROR(StartServers(options, env, tls, record));
  progress << "started api, checkpoint, metrics" << (tls.enabled() ? " (TLS)" : " (plaintext)")
           << "\n";
  GRADHUB_RETURN_IF_ERROR(StartAgents(options, env, tokens.node, tls, record));
  progress << "started " << absl::StrJoin(kAgents, ", ") << "\n";
  GRADHUB_RETURN_IF_ERROR(StartPrometheus(options, env, tls, record));
  return tokens;
}

// SIGTERM to every recorded process that is still ours (not PostgreSQL: pg_ctl stops it), the
// last started first; SIGKILL to those still running after kStopTimeout.
void StopProcesses(const ClusterRecord& record, std::ostream& progress) {
  std::vector<const ClusterProcess*> stopping;
  for (auto it = record.processes.rbegin(); it != record.processes.rend(); ++it) {
    if (it->name == kPostgres) continue;
    if (!IsRunning(record, *it)) {
      progress << it->name << " (pid " << it->pid << ") was not running\n";
      continue;
    }
    kill(it->pid, SIGTERM);
    stopping.push_back(&*it);
  }
  auto wait = [&](absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    while (absl::Now() < deadline) {
      bool any = false;
      for (const ClusterProcess* process : stopping) any = any || IsRunning(record, *process);
      if (!any) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  };
  wait(kStopTimeout);
  for (const ClusterProcess* process : stopping) {
    if (IsRunning(record, *process)) {
      progress << process->name << " ignored SIGTERM for " << kStopTimeout << "; killing it\n";
      kill(process->pid, SIGKILL);
    }
  }
  wait(absl::Seconds(5));
  for (const ClusterProcess* process : stopping) {
    progress << "stopped " << process->name << " (pid " << process->pid << ")\n";
  }
}

// Removes the client config if it is the one this cluster wrote (it names our api).
void RemoveClientConfig(const ClusterRecord& record) {
  const std::string path = ClientConfigPath();
  absl::StatusOr<std::map<std::string, std::string>> config = ReadClientConfig(path);
  if (config.ok() && config->count("server") > 0 && config->at("server") == ApiTargets(record)) {
    std::remove(path.c_str());
  }
}

}  // namespace

LocalClusterOptions DefaultClusterOptions() {
  LocalClusterOptions options;
  options.state_dir = fs::absolute(StateDir()).lexically_normal().string();
  if (const char* bin = std::getenv("GRADHUB_BIN"); bin != nullptr && *bin != '\0') {
    options.bin_dir = bin;
  } else {
    std::error_code error;
    options.bin_dir = fs::read_symlink("/proc/self/exe", error).parent_path().string();
  }
  if (const char* url = std::getenv("GRADHUB_DATABASE_URL"); url != nullptr) {
    options.database_url = url;
  }
  options.postgres_bin = "/usr/lib/postgresql/15/bin";
  if (FILE* pg_config = popen("pg_config --bindir 2>/dev/null", "r")) {
    char line[4096] = {};
    const std::string dir = fgets(line, sizeof(line), pg_config) ? FirstLine(line) : "";
    pclose(pg_config);
    if (!dir.empty() && access((dir + "/initdb").c_str(), X_OK) == 0) options.postgres_bin = dir;
  }
  for (const std::string& root :
       {std::string("/usr/lib/python3/dist-packages/sklearn/datasets/data"),
        std::string("/usr/lib/python3/dist-packages/sklearn/datasets/descr"),
        std::string(GRADHUB_SOURCE_DIR) + "/deploy/examples", options.state_dir + "/data"}) {
    if (fs::is_directory(root) || root == options.state_dir + "/data") {
      options.data_roots.push_back(root);
    }
  }
  return options;
}

absl::StatusOr<UpResult> ClusterUp(const LocalClusterOptions& options, std::ostream& progress) {
  GRADHUB_RETURN_IF_ERROR(PrepareStateDir(options.state_dir));
  GRADHUB_RETURN_IF_ERROR(LockStateDir(options.state_dir));
  GRADHUB_ASSIGN_OR_RETURN(std::optional<ClusterRecord> existing,
                           ReadClusterRecord(options.state_dir));
  if (existing.has_value()) {
    std::vector<std::string> stopped;
    for (const ClusterProcess& process : existing->processes) {
      if (!IsRunning(*existing, process)) stopped.push_back(process.name);
    }
    if (stopped.empty()) return UpResult{*std::move(existing), /*already_up=*/true};
    if (stopped.size() < existing->processes.size()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the local cluster in ", options.state_dir, " is partly down (stopped: ",
          absl::StrJoin(stopped, ", "), "): `gradhub cluster down`, then `gradhub cluster up`"));
    }
    // Nothing of it runs (the machine restarted): start afresh.
    std::remove(RecordPath(options.state_dir).c_str());
  }
  ClusterRecord record;
  record.state_dir = options.state_dir;
  absl::StatusOr<ClusterTokens> tokens = StartAll(options, &record, progress);
  if (!tokens.ok()) {
    progress << "gradhub cluster up failed; stopping what it started\n";
    StopProcesses(record, progress);
    (void)StopPostgres(record, progress);
    std::remove(RecordPath(options.state_dir).c_str());
    return tokens.status();
  }
  GRADHUB_RETURN_IF_ERROR(WriteClientConfig(
      ClientConfigPath(), {{"server", ApiTargets(record)},
                           {"checkpoint-server", Endpoint(record, "checkpoint", "gRPC")},
                           {"token", tokens->tenant},
                           {"tls-ca", ClusterTls(record.tls_dir).ca_file()}}));
  return UpResult{std::move(record), /*already_up=*/false};
}

absl::Status ClusterDown(const std::string& state_dir, std::ostream& progress) {
  if (!fs::exists(RecordPath(state_dir))) {
    return absl::NotFoundError(absl::StrCat("no local cluster is recorded in ", state_dir));
  }
  GRADHUB_RETURN_IF_ERROR(LockStateDir(state_dir));
  GRADHUB_ASSIGN_OR_RETURN(std::optional<ClusterRecord> record, ReadClusterRecord(state_dir));
  if (!record.has_value()) {
    return absl::NotFoundError(absl::StrCat("no local cluster is recorded in ", state_dir));
  }
  StopProcesses(*record, progress);
  GRADHUB_RETURN_IF_ERROR(StopPostgres(*record, progress));
  RemoveClientConfig(*record);
  std::remove(RecordPath(state_dir).c_str());
  return absl::OkStatus();
}

absl::StatusOr<std::optional<ClusterRecord>> ReadClusterRecord(const std::string& state_dir) {
  const std::string path = RecordPath(state_dir);
  if (!fs::exists(path)) return std::nullopt;
  try {
    return FromJson(nlohmann::json::parse(ReadText(path)));
  } catch (const nlohmann::json::exception& error) {
    return absl::DataLossError(absl::StrCat(path, ": ", error.what()));
  }
}

bool IsRunning(const ClusterRecord& record, const ClusterProcess& process) {
  if (process.name == kPostgres) return IsPostgresRunning(record);
  return IsClusterProcess(process.pid, process.binary, record.state_dir);
}

std::string ApiTargets(const ClusterRecord& record) {
  std::vector<std::string> targets;
  for (const ClusterProcess& process : record.processes) {
    if (process.name == "api" || absl::StartsWith(process.name, "api-")) {
      targets.push_back(Endpoint(record, process.name, "gRPC"));
    }
  }
  return absl::StrJoin(targets, ",");
}

std::string ServiceLogPath(const std::string& state_dir, const std::string& service) {
  if (service == kPostgres) return state_dir + "/postgres/postgres.log";
  return state_dir + "/logs/" + service + ".log";
}

}  // namespace gradhub::cli
