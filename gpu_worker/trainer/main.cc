// gradhub-trainer: one rank of a training job. Started by the node agent, or by hand:
//   gradhub-trainer --spec job.yaml --rank 0 --world-size 2 --store file:/tmp/rdzv
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <memory>
#include <new>

#include "gpu_worker/checkpoint_client/grpc_checkpoint_sink.h"
#include "gpu_worker/ddp/comm/work.h"
#include "gpu_worker/ddp/store/file_store.h"
#include "gpu_worker/ddp/store/in_memory_store.h"
#include "gpu_worker/ddp/store/prefix_store.h"
#include "gpu_worker/store_client/grpc_store.h"
#include "gpu_worker/trainer/local_checkpoint_sink.h"
#include "gpu_worker/trainer/metrics_telemetry_sink.h"
#include "gpu_worker/trainer/peer_reachability.h"
#include "gpu_worker/trainer/trainer.h"
#include "services/common/abseil_mode.h"
#include "services/common/contract/data_paths.h"
#include "services/common/contract/defaults.h"
#include "services/common/contract/input_file.h"
#include "services/common/contract/job_spec.h"
#include "services/common/contract/trainer_exit_codes.h"
#include "services/common/contract/unreachable_nodes.h"
#include "services/common/contract/user_error.h"
#include "services/common/flags.h"
#include "services/common/heap_mode.h"

namespace {

using namespace gradhub;

// How long a rank whose collective failed probes its peers' nodes (peer_reachability.h).
constexpr std::chrono::milliseconds kPeerProbeTimeout{3000};

struct TrainerConfig {
  std::string spec;
  int64_t rank = 0;
  int64_t world_size = 1;
  int64_t local_rank = -1;
  int64_t local_world_size = 0;
  std::string store;
  std::string token;
  std::string tls_ca_file;
  std::string job_id = "local";
  int64_t attempt = 1;
  std::string checkpoint_dir;
  std::string checkpoint_server;
  std::string metrics_server;
  std::string node;
  int64_t threads = 0;
  // Set by the agent from the node it runs on (gpu_worker/agent/rank_launch.h).
  std::string device = "cpu";
  std::string backend;
  absl::Duration collective_timeout = absl::FromChrono(defaults::kCollectiveTimeout);
  absl::Duration preempt_grace = absl::Seconds(8);
  // The node's input policy (services/common/contract/input_file.h), set by the agent.
  std::string data_roots = "*";
  int64_t max_input_bytes = int64_t{4} << 30;
  int64_t memory_limit_bytes = 0;
  std::string dump_parameters;
  std::string scratch_dir;
  std::string listen_address;

  void Register(Flags& flags) {
    flags.String("spec", "GRADHUB_SPEC", &spec, "Job spec file (YAML or JSON, proto3 JSON names)")
        .Int("rank", "GRADHUB_RANK", &rank, "This process's rank, 0 <= rank < world size")
        .Int("world-size", "GRADHUB_WORLD_SIZE", &world_size, "Number of ranks")
        .Int("local-rank", "GRADHUB_LOCAL_RANK", &local_rank,
             "Rank among this node's ranks; -1 = same as --rank")
        .Int("local-world-size", "GRADHUB_LOCAL_WORLD_SIZE", &local_world_size,
             "Ranks on this node; 0 = --world-size")
        .String("store", "GRADHUB_STORE", &store,
                "Rendezvous store: grpc://host:port (gradhub-api), file:/dir for ranks on one "
                "machine; empty for world size 1")
        .String("token", "GRADHUB_TOKEN", &token,
                "Bearer token for the grpc:// store, the checkpoint store and telemetry: the "
                "rank's job token (set by the agent), or by hand the admin token")
        .String("tls-ca", "GRADHUB_TLS_CA", &tls_ca_file,
                "PEM certificates trusted for TLS to the grpc:// store; empty = plaintext")
        .String("job-id", "GRADHUB_JOB_ID", &job_id, "Job id, scopes rendezvous keys")
        .Int("attempt", "GRADHUB_ATTEMPT", &attempt, "Attempt number, scopes rendezvous keys")
        .String("checkpoint-dir", "GRADHUB_CHECKPOINT_DIR", &checkpoint_dir,
                "Without --checkpoint-server: the directory checkpoints go to, resumed from "
                "the newest. With it: a local cache of the store's blobs. Empty = none")
        .String("checkpoint-server", "GRADHUB_CHECKPOINT_SERVER", &checkpoint_server,
                "host:port of gradhub-checkpoint; rank 0 saves there and resumes from the "
                "job's latest committed checkpoint. Empty = --checkpoint-dir only")
        .String("metrics-server", "GRADHUB_METRICS_SERVER", &metrics_server,
                "host:port of gradhub-metrics; every rank sends each step's telemetry there "
                "(queued, never waited for). Empty = none")
        .String("node", "GRADHUB_NODE_NAME", &node,
                "This node's name, sent with telemetry (set by the agent)")
        .Duration("preempt-grace", "GRADHUB_PREEMPT_GRACE", &preempt_grace,
                  "On SIGTERM, how long rank 0 may take to commit its last checkpoint")
        .Int("threads", "GRADHUB_THREADS", &threads,
             "Intra-op threads; 0 = cores divided by local ranks")
        .String("device", "GRADHUB_DEVICE", &device,
                "cpu, or cuda: train on the GPU CUDA_VISIBLE_DEVICES gives this rank (cuda:0; "
                "without it cuda:<local rank>) (set by the agent)")
        .String("backend", "GRADHUB_BACKEND", &backend,
                "NCCL or GLOO: what the spec's backend AUTO becomes (set by the agent from the "
                "node's kind); empty = NCCL on cuda, GLOO on cpu")
        .String("data-roots", "GRADHUB_DATA_ROOTS", &data_roots,
                "':'-separated directories the spec's files must lie under (set by the agent; "
                "':' alone = none allowed); * = any path, for a trainer run by hand")
        .Int("max-input-bytes", "GRADHUB_MAX_INPUT_BYTES", &max_input_bytes,
             "Largest dataset or model file read (after gzip decompression)")
        .Int("memory-limit-bytes", "GRADHUB_MEMORY_LIMIT_BYTES", &memory_limit_bytes,
             "The memory limit the agent put on this rank, for the out-of-memory message; "
             "0 = none")
        .String("scratch-dir", "GRADHUB_SCRATCH_DIR", &scratch_dir,
                "Where a pipeline's ranks write stage states on their way to and from a "
                "checkpoint (unnamed files: page cache, not the rank's memory); empty = the "
                "current directory, which the agent makes the rank's own")
        .String("dump-parameters", "GRADHUB_DUMP_PARAMETERS", &dump_parameters,
                "A directory each rank writes its final parameters to, as text "
                "(rank-<rank>.txt), for comparing runs; empty = none");
    RegisterPeerFlags(flags);
  }

 private:
  // How the rank meets its peers on other nodes.
  void RegisterPeerFlags(Flags& flags) {
    flags
        .String("listen-address", "GRADHUB_LISTEN_ADDRESS", &listen_address,
                "Address Gloo listens on for this rank's peers (set by the agent: its node's "
                "advertised address); empty = the interface GLOO_SOCKET_IFNAME names, else the "
                "hostname")
        .Duration("collective-timeout", "GRADHUB_COLLECTIVE_TIMEOUT", &collective_timeout,
                  "A collective that does not complete in this time fails the rank (set by "
                  "the agent: the job's distributed.collectiveTimeoutSeconds, else the node's)");
  }
};

// Set by SIGTERM once the loop runs; the loop reads it between steps (see TrainerOptions).
std::atomic<bool> g_stop_requested{false};
// Set when the loop is about to take its first step (TrainerOptions::on_loop_start).
std::atomic<bool> g_loop_started{false};

// Before the loop a stop has nothing to save: the rank leaves at once, as preempted.
void RequestStop(int) {
  if (!g_loop_started.load()) {
    static constexpr char kLine[] = "gradhub-trainer: stopped (SIGTERM) before training began\n";
    [[maybe_unused]] const ssize_t written = write(STDERR_FILENO, kLine, sizeof(kLine) - 1);
    _exit(trainer::kExitPreempted);
  }
  g_stop_requested.store(true);
}

void InstallStopHandler() {
  struct sigaction action = {};
  action.sa_handler = RequestStop;
  action.sa_flags = SA_RESTART;  // a blocking read in gloo or the loader resumes, not fails
  sigemptyset(&action.sa_mask);
  sigaction(SIGTERM, &action, nullptr);
}

// The store when --checkpoint-server is set (the cache under --checkpoint-dir), else files in
// --checkpoint-dir, else none. Only rank 0 reads or writes checkpoints.
std::shared_ptr<trainer::CheckpointSink> OpenCheckpoints(const TrainerConfig& config,
                                                         const v1::JobSpec& spec) {
  if (config.rank != 0) return nullptr;
  if (!config.checkpoint_server.empty()) {
    checkpoint_client::GrpcCheckpointSinkOptions options;
    options.address = config.checkpoint_server;
    options.token = config.token;
    options.tls_ca_file = config.tls_ca_file;
    options.job = "jobs/" + config.job_id;
    options.attempt = static_cast<int32_t>(config.attempt);
    options.cache_dir = config.checkpoint_dir;
    return checkpoint_client::MakeGrpcCheckpointSink(options);
  }
  if (!config.checkpoint_dir.empty()) {
    return std::make_shared<trainer::LocalCheckpointSink>(
        config.checkpoint_dir, WithDefaults(spec).checkpoint().keep_last());
  }
  return nullptr;
}

std::shared_ptr<trainer::TelemetrySink> OpenTelemetry(const TrainerConfig& config) {
  if (config.metrics_server.empty()) return nullptr;
  telemetry_client::TelemetryReporterOptions options;
  options.address = config.metrics_server;
  options.token = config.token;
  options.tls_ca_file = config.tls_ca_file;
  options.job = "jobs/" + config.job_id;
  options.attempt = static_cast<int32_t>(config.attempt);
  options.rank = static_cast<int32_t>(config.rank);
  options.node = config.node.empty() ? "" : "nodes/" + config.node;
  return std::make_shared<trainer::MetricsTelemetrySink>(options);
}

// --device and --backend into the trainer's options; UserError naming the flag otherwise.
void SetPlacement(const TrainerConfig& config, trainer::TrainerOptions* options) {
  if (config.device == "cuda") {
    options->device = trainer::DeviceKind::kCuda;
  } else if (config.device != "cpu") {
    throw UserError("--device", "'" + config.device + "' is not cpu or cuda");
  }
  if (!config.backend.empty() &&
      (!v1::DistributedSpec::Backend_Parse(config.backend, &options->backend) ||
       options->backend == v1::DistributedSpec::AUTO)) {
    throw UserError("--backend", "'" + config.backend + "' is not NCCL or GLOO");
  }
}

InputPolicy InputPolicyOf(const TrainerConfig& config) {
  InputPolicy policy;
  policy.enforce_roots = config.data_roots != "*";
  if (policy.enforce_roots) policy.data_roots = SplitRootList(config.data_roots);
  policy.max_bytes = config.max_input_bytes;
  return policy;
}

// An allocation that failed: std::bad_alloc, or libtorch's CPU allocator refusing (a
// c10::Error whose text says so; libtorch 1.13 has no distinct type for it on CPU).
bool IsOutOfMemory(const std::exception& error) {
  if (dynamic_cast<const std::bad_alloc*>(&error) != nullptr) return true;
  const std::string what = error.what();
  return what.find("can't allocate memory") != std::string::npos ||
         what.find("not enough memory") != std::string::npos;
}

std::string OutOfMemoryMessage(const TrainerConfig& config) {
  return config.memory_limit_bytes > 0
             ? "out of memory: limit " + std::to_string(config.memory_limit_bytes) + " bytes"
             : std::string("out of memory");
}

std::shared_ptr<ddp::Store> OpenStore(const TrainerConfig& config) {
  std::shared_ptr<ddp::Store> store;
  if (std::string address = store_client::GrpcStoreAddress(config.store); !address.empty()) {
    store_client::GrpcStoreOptions options;
    options.token = config.token;
    options.tls_ca_file = config.tls_ca_file;
    store = store_client::MakeGrpcStore(address, options);
  } else if (config.store.rfind("file:", 0) == 0) {
    store = std::make_shared<ddp::FileStore>(config.store.substr(5));
  } else if (config.store.empty() && config.world_size == 1) {
    store = std::make_shared<ddp::InMemoryStore>();
  } else {
    throw UserError("--store",
                    "'" + config.store + "' is not a store address (grpc://host:port, file:/dir)");
  }
  return std::make_shared<ddp::PrefixStore>(
      store, "jobs/" + config.job_id + "/attempts/" + std::to_string(config.attempt));
}

// --rank and --world-size; UserError naming the flag otherwise.
void CheckRank(const TrainerConfig& config) {
  if (config.world_size < 1 || config.rank < 0 || config.rank >= config.world_size) {
    throw UserError("--rank", std::to_string(config.rank) + " is not in [0, " +
                                  std::to_string(config.world_size) + ")");
  }
}

// What this rank was started with, in its log: where it trains is decided from these.
void LogPlacement(const TrainerConfig& config, const std::string& who) {
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  std::cerr << who << "GRADHUB_DEVICE=" << config.device
            << " GRADHUB_BACKEND=" << (config.backend.empty() ? "(unset)" : config.backend)
            << " CUDA_VISIBLE_DEVICES=" << (visible ? visible : "(unset)") << "\n";
}

trainer::TrainerOptions TrainerOptionsOf(const TrainerConfig& config, const v1::JobSpec& spec,
                                         const std::string& who) {
  trainer::TrainerOptions options;
  options.rank = static_cast<int>(config.rank);
  options.world_size = static_cast<int>(config.world_size);
  options.local_rank = static_cast<int>(config.local_rank >= 0 ? config.local_rank : config.rank);
  options.local_world_size =
      static_cast<int>(config.local_world_size > 0 ? config.local_world_size : config.world_size);
  options.store = OpenStore(config);
  options.threads = static_cast<int>(config.threads);
  SetPlacement(config, &options);
  LogPlacement(config, who);
  options.collective_timeout = absl::ToChronoMilliseconds(config.collective_timeout);
  options.listen_address = config.listen_address;
  options.checkpoints = OpenCheckpoints(config, spec);
  options.telemetry = OpenTelemetry(config);
  options.stop_requested = &g_stop_requested;
  options.on_loop_start = [] { g_loop_started.store(true); };
  options.preempt_grace = absl::ToChronoMilliseconds(config.preempt_grace);
  options.progress = &std::cout;
  options.log = &std::cerr;
  options.parameters_dump_dir = config.dump_parameters;
  options.scratch_dir = config.scratch_dir;
  return options;
}

// Set once the rank's store is open: what a lost peer's node is checked with (ExitCodeOf).
std::unique_ptr<trainer::PeerReachability> g_reachability;

void RunTrainer(const TrainerConfig& config, const std::string& who) {
  if (config.spec.empty()) throw UserError("--spec", "is required");
  CheckRank(config);
  SetInputPolicy(InputPolicyOf(config));
  const v1::JobSpec spec = LoadJobSpec(config.spec);
  trainer::TrainerOptions options = TrainerOptionsOf(config, spec, who);
  if (options.world_size > 1) {
    try {
      g_reachability = trainer::PeerReachability::Publish(
          options.store, options.rank, config.node.empty() ? "" : "nodes/" + config.node,
          config.listen_address);
    } catch (const std::exception& error) {  // the rendezvous will say what is wrong
      std::cerr << who << "cannot publish its probe address: " << error.what() << "\n";
    }
  }
  trainer::Train(spec, options);
}

// "; nodes/a cannot reach nodes/b" when the probe finds nodes this rank cannot reach, else "".
std::string UnreachablePeers(const TrainerConfig& config) {
  if (!g_reachability) return "";
  const std::vector<std::string> unreachable =
      g_reachability->UnreachableNodes(static_cast<int>(config.world_size), kPeerProbeTimeout);
  if (unreachable.empty()) return "";
  return "; " + UnreachableNodesStatement(g_reachability->node(), unreachable);
}

// The exit code of a run that threw `thrown` (contract/trainer_exit_codes.h), after saying why
// on stderr.
int ExitCodeOf(std::exception_ptr thrown, const TrainerConfig& config, const std::string& who) {
  try {
    std::rethrow_exception(thrown);
  } catch (const UserError& error) {
    std::cerr << who << error.what() << "\n";
    return trainer::kExitUserError;
  } catch (const trainer::TrainingFailure& error) {
    std::cerr << who << "training failed: " << error.what() << "\n";
    return trainer::kExitTrainingFailure;
  } catch (const trainer::Preempted& error) {
    std::cerr << who << "preempted: " << error.what() << "\n";
    return trainer::kExitPreempted;
  } catch (const ddp::CommError& error) {
    if (g_stop_requested.load()) {  // rank 0 saved and left first, as asked
      std::cerr << who << "preempted: peers left after the stop request\n";
      return trainer::kExitPreempted;
    }
    std::cerr << who << "lost its peers: " << error.what() << UnreachablePeers(config) << "\n";
    return trainer::kExitInfrastructure;
  } catch (const trainer::DeviceUnavailable& error) {
    std::cerr << who << "no GPU: " << error.what() << "\n";
    return trainer::kExitInfrastructure;
  } catch (const ddp::StoreError& error) {
    std::cerr << who << "rendezvous failed: " << error.what() << "\n";
    return trainer::kExitInfrastructure;
  } catch (const ddp::StoreTimeoutError& error) {
    std::cerr << who << "rendezvous timed out: " << error.what() << "\n";
    return trainer::kExitInfrastructure;
  } catch (const std::exception& error) {
    if (IsOutOfMemory(error)) {
      std::cerr << who << OutOfMemoryMessage(config) << "\n";
      return trainer::kExitOutOfMemory;
    }
    std::cerr << who << "failed: " << error.what() << "\n";
    return trainer::kExitTrainingFailure;
  }
}

}  // namespace

int main(int argc, char** argv) {
  gradhub::TurnOffMutexDeadlockDetection();
  gradhub::KeepFreedHeapForTheNextMessage(gradhub::kForTensors);
  TrainerConfig config;
  Flags flags("gradhub-trainer",
              "gradhub-trainer: one rank of a gradhub training job.\n\n"
              "Prints one JSON object per progress interval on stdout (rank 0) and a readable "
              "log on stderr.\nExit codes: 0 done, 2 usage, 10 user error (spec, data), 11 "
              "training failure (NaN), 12 infrastructure (peers, store), 13 preempted "
              "(SIGTERM), 14 out of memory.");
  config.Register(flags);
  std::vector<std::string> args;
  if (std::optional<int> exit = flags.ParseOrExitCode(argc, argv, &args, trainer::kExitUsage)) {
    return *exit;
  }
  const std::string who = "gradhub-trainer (rank " + std::to_string(config.rank) + "): ";
  InstallStopHandler();
  try {
    RunTrainer(config, who);
    return trainer::kExitSuccess;
  } catch (...) {
    return ExitCodeOf(std::current_exception(), config, who);
  }
}
