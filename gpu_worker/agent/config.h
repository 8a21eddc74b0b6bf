#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "gpu_worker/agent/isolation.h"
#include "gpu_worker/agent/node_devices.h"
#include "services/common/api_targets.h"
#include "services/common/contract/defaults.h"
#include "services/common/flags.h"

namespace gradhub::agent {

// Every setting of gradhub-agent, with its flag, environment variable and default. Defaults
// that depend on the machine (name, trainer) are filled in by main before Register, so --help
// shows them.
struct AgentConfig {
  std::string server = "localhost:7070";
  std::string token;
  std::string tls_ca_file;
  // The node's client certificate and key (TLS to gradhub-api and gradhub-checkpoint); never
  // handed to ranks.
  std::string tls_cert_file;
  std::string tls_key_file;
  std::string name;  // the hostname unless set
  // -1 = one per GPU on a CUDA node, 1 on a CPU node (EffectiveSlots, node_description.h).
  int64_t slots = -1;
  // For tests only: see this many GPUs that are not there (FakeGpus, node_devices.h).
  int64_t fake_gpus = 0;
  std::string labels;  // k=v,k=v
  // "" = the source address of the route to --server (node_address.h); main resolves it.
  std::string address;
  std::string work_dir = "/var/lib/gradhub/agent";
  std::string checkpoint_root;  // empty = <work-dir>/checkpoints
  std::string checkpoint_server;
  std::string metrics_server;
  std::string trainer;  // gradhub-trainer next to this binary unless set
  // Script jobs (JobSpec.script, script_launch.h).
  int64_t master_port_base = 29500;  // 0 = this node runs no script jobs
  std::string checkpoint_url;        // gradhub-checkpoint's REST base URL, for the module
  std::string metrics_url;           // gradhub-metrics' HTTP base URL, for the module
  std::string python_dir;            // <this binary's dir>/../python unless set
  // Script ranks run as a uid of their job's own, in [base, base + count), when the agent is
  // root: another job's rank, even of the same tenant, cannot read their files or /proc.
  int64_t job_uid_base = 1900000000;
  int64_t job_uid_count = int64_t{1} << 20;
  absl::Duration stop_grace = absl::Seconds(10);
  // How long ranks keep running while no Heartbeat succeeds (api restart, network): see
  // agent.h step 7.
  absl::Duration api_outage_grace = absl::FromChrono(defaults::kApiOutageGrace);
  int64_t log_buffer_bytes = int64_t{64} << 20;
  absl::Duration shutdown_log_flush = absl::Seconds(5);
  // Isolation between tenants (isolation.h).
  std::string run_as;  // "" = gradhub-rank when root, the agent's own user otherwise
  std::vector<std::string> data_roots;
  std::vector<std::string> tenant_data_roots;  // TENANT=DIR (tenant_roots.h)
  int64_t tenant_gid_base = 1800000000;
  int64_t tenant_gid_count = int64_t{1} << 24;
  int64_t max_input_bytes = int64_t{4} << 30;
  int64_t memory_per_slot = 0;  // 0 = machine memory / slots, < 0 = unlimited
  std::string memory_isolation = "auto";
  std::string cgroup_parent;

  // Not a flag: what main made of the isolation flags on this machine (SetUpIsolation).
  NodeIsolation isolation;
  // Not a flag: the GPUs main found (DiscoverNodeDevices) before resolving slots.
  NodeDevices devices;
  // Not a flag: what every rank's environment gets for its collectives' network (the listen
  // address, GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME: RankNetworkEnvironment, node_address.h).
  std::map<std::string, std::string> rank_network_env;
  // Not a flag: --server as a channel target (services/common/api_targets.h); main resolves it.
  ApiTarget api_target;

  void Register(Flags& flags) {
    flags
        .String("server", "GRADHUB_SERVER", &server,
                "host:port of the gradhub-api gRPC port, or every replica's, comma-separated "
                "(host1:7070,host2:7070); a stream or call on a replica that is gone moves to "
                "the next")
        .String("token", "GRADHUB_NODE_TOKEN", &token,
                "Node token (gradhub-api create-node-token), sent as a bearer token")
        .String("tls-ca", "GRADHUB_TLS_CA", &tls_ca_file,
                "PEM certificates trusted for TLS to --server (its ranks get it too); "
                "empty = plaintext")
        .String("tls-cert", "GRADHUB_TLS_CERT", &tls_cert_file,
                "PEM client certificate of this node (CN = --name; `gradhub cluster certs "
                "--nodes`), presented to the servers with --tls-key; needs --tls-ca. Not given "
                "to ranks")
        .String("tls-key", "GRADHUB_TLS_KEY", &tls_key_file, "PEM private key of --tls-cert")
        .String("name", "GRADHUB_NODE_NAME", &name, "Node name, stable across restarts")
        .Int("slots", "GRADHUB_SLOTS", &slots,
             "Ranks this node runs at once; -1 = one per GPU on a GPU node (each rank gets its "
             "own GPU, so never more than the GPUs), 1 on a CPU node")
        .Int("fake-gpus", "GRADHUB_FAKE_GPUS", &fake_gpus,
             "For tests only: register as a GPU node with this many GPUs that are not there "
             "(their ranks cannot use them); 0 = the GPUs the CUDA runtime finds")
        .String("labels", "GRADHUB_NODE_LABELS", &labels,
                "Node labels matched by JobSpec.nodeSelector, as k=v,k=v")
        .String("address", "GRADHUB_NODE_ADDRESS", &address,
                "Address at which other nodes' ranks reach this node's ranks (their Gloo, NCCL "
                "and MASTER_ADDR); empty = the source address of this machine's route to "
                "--server. A loopback address is refused unless --server is on this machine")
        .String("work-dir", "GRADHUB_WORK_DIR", &work_dir,
                "Per-rank working directories (jobs/<id>/attempt-<n>/rank-<r>/) and pid files")
        .String("checkpoint-root", "GRADHUB_CHECKPOINT_ROOT", &checkpoint_root,
                "With --checkpoint-server: this node's cache of checkpoint blobs, <this>/<job "
                "id>. Without: where checkpoints go (then a restart resumes only on a node that "
                "sees the same directory). Empty = <work-dir>/checkpoints")
        .String("checkpoint-server", "GRADHUB_CHECKPOINT_SERVER", &checkpoint_server,
                "host:port of gradhub-checkpoint's gRPC port, handed to ranks: rank 0 saves "
                "there and a restarted attempt resumes from it on any node")
        .String("metrics-server", "GRADHUB_METRICS_SERVER", &metrics_server,
                "host:port of gradhub-metrics' gRPC port, handed to ranks for telemetry; "
                "empty = none")
        .String("trainer", "GRADHUB_TRAINER", &trainer, "Path of the gradhub-trainer binary");
    RegisterRankFlags(flags);
    RegisterScriptFlags(flags);
    RegisterIsolationFlags(flags);
  }

 private:
  // Script jobs (script_launch.h).
  void RegisterScriptFlags(Flags& flags) {
    flags
        .Int("master-port-base", "GRADHUB_MASTER_PORT_BASE", &master_port_base,
             "Script jobs' MASTER_PORT when their rank 0 runs here: this port plus rank 0's slot "
             "(so --slots ports from here must be free); 0 = this node runs no script jobs")
        .String("checkpoint-url", "GRADHUB_CHECKPOINT_URL", &checkpoint_url,
                "Base URL of gradhub-checkpoint's REST port (http://host:port), handed to "
                "script ranks for the gradhub module's save_checkpoint/load_latest_checkpoint")
        .String("metrics-url", "GRADHUB_METRICS_URL", &metrics_url,
                "Base URL of gradhub-metrics' HTTP port (http://host:9464), handed to script "
                "ranks: the gradhub module's report() also posts telemetry there; empty = none")
        .String("python-dir", "GRADHUB_PYTHON_DIR", &python_dir,
                "Folder holding the gradhub Python module, put on script ranks' PYTHONPATH")
        .Int("job-uid-base", "GRADHUB_JOB_UID_BASE", &job_uid_base,
             "First uid of the range script ranks run as, one uid per job (agent as root)")
        .Int("job-uid-count", "GRADHUB_JOB_UID_COUNT", &job_uid_count, "Size of that range");
  }

  // How ranks are stopped and their output shipped.
  void RegisterRankFlags(Flags& flags) {
    flags
        .Duration("stop-grace", "GRADHUB_STOP_GRACE", &stop_grace,
                  "Time between SIGTERM and SIGKILL when a rank is stopped")
        .Duration("api-outage-grace", "GRADHUB_API_OUTAGE_GRACE", &api_outage_grace,
                  "How long ranks keep running while no heartbeat reaches gradhub-api "
                  "(an api restart); after it the agent stops them")
        .Int("log-buffer-bytes", "GRADHUB_LOG_BUFFER_BYTES", &log_buffer_bytes,
             "Most rank output held while the server is not taking it; the oldest is dropped")
        .Duration("shutdown-log-flush", "GRADHUB_SHUTDOWN_LOG_FLUSH", &shutdown_log_flush,
                  "On SIGTERM, how long to try to ship the remaining output");
  }

  // Isolation between tenants (isolation.h).
  void RegisterIsolationFlags(Flags& flags) {
    flags
        .String("run-as", "GRADHUB_RUN_AS", &run_as,
                "User the ranks run as when the agent is root (never root); empty = "
                "gradhub-rank (make setup creates it). A non-root agent runs ranks as itself")
        .StringList("data-root", "GRADHUB_DATA_ROOTS", &data_roots,
                    "Directory whose files jobs may name (datasets, models); repeatable (the "
                    "variable: ':'-separated). None = jobs may name no file on this node")
        .StringList("tenant-data-root", "GRADHUB_TENANT_DATA_ROOTS", &tenant_data_roots,
                    "TENANT=DIR: a directory only tenant TENANT's jobs may name and read, as "
                    "--data-root; repeatable (the variable: ':'-separated). A root agent gives DIR "
                    "the tenant's group and mode 0750, and that group only to the tenant's ranks")
        .Int("tenant-gid-base", "GRADHUB_TENANT_GID_BASE", &tenant_gid_base,
             "First gid of the range tenant groups come from: a tenant's gid is this plus "
             "FNV-1a(tenants/<id>) modulo --tenant-gid-count (apart from the job uids)")
        .Int("tenant-gid-count", "GRADHUB_TENANT_GID_COUNT", &tenant_gid_count,
             "Size of that range")
        .Int("max-input-bytes", "GRADHUB_MAX_INPUT_BYTES", &max_input_bytes,
             "Largest dataset or model file a rank reads (after gzip decompression)")
        .Int("memory-per-slot", "GRADHUB_MEMORY_PER_SLOT", &memory_per_slot,
             "Memory limit of each rank in bytes (a job may ask less, memoryPerRankMib, never "
             "more); 0 = this machine's memory divided by --slots, negative = no limit")
        .String("memory-isolation", "GRADHUB_MEMORY_ISOLATION", &memory_isolation,
                "How the memory limit is enforced: auto (cgroup v2, else v1, else rlimit), "
                "cgroup-v2, cgroup-v1, rlimit (RLIMIT_DATA) or none (no cap; a job's own "
                "memoryPerRankMib is still applied, by RLIMIT_DATA)")
        .String("cgroup-parent", "GRADHUB_CGROUP_PARENT", &cgroup_parent,
                "Cgroup directory under which rank cgroups go (a delegated one on cgroup v2); "
                "empty = the agent's own cgroup");
  }
};

}  // namespace gradhub::agent
