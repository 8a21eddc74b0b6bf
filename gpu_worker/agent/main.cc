// gradhub-agent: the node agent. Registers this node with gradhub-api, heartbeats, starts and
// stops one gradhub-trainer per rank the server assigns here, and ships their output. The
// protocol is described in proto/gradhub/v1/nodes.proto and gpu_worker/agent/agent.h.
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <optional>
#include <thread>

#include "gpu_worker/agent/agent.h"
#include "gpu_worker/agent/config.h"
#include "gpu_worker/agent/node_address.h"
#include "gpu_worker/agent/node_description.h"
#include "services/common/abseil_mode.h"
#include "services/common/api_targets.h"
#include "services/common/grpc_credentials.h"
#include "services/common/shutdown_signals.h"

namespace {

constexpr char kSummary[] =
    "gradhub-agent: the gradhub node agent.\n\n"
    "Usage: gradhub-agent [flags]\n\n"
    "Registers this node with gradhub-api (--server), then runs one gradhub-trainer process per\n"
    "rank the scheduler places here, until SIGTERM or SIGINT: then it stops its ranks (SIGTERM,\n"
    "SIGKILL after --stop-grace), ships the rest of their output and exits 0.";

std::string Hostname() {
  char name[HOST_NAME_MAX + 1] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "localhost";
  return name;
}

// This binary's folder ("" when unknown): the trainer and the Python module are found from it.
std::filesystem::path SelfDir() {
  std::error_code error;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", error);
  return error ? std::filesystem::path() : self.parent_path();
}

// gradhub-trainer next to this binary.
std::string DefaultTrainer() {
  const std::filesystem::path dir = SelfDir();
  return dir.empty() ? "gradhub-trainer" : (dir / "gradhub-trainer").string();
}

// The gradhub Python module of script ranks: <bin>/../python, as the build and the images lay
// it out.
std::string DefaultPythonDir() {
  const std::filesystem::path dir = SelfDir();
  return dir.empty() ? "" : (dir.parent_path() / "python").lexically_normal().string();
}

using gradhub::agent::AgentConfig;

// Flags, then the checks no other part makes. An exit code when the agent must not start.
std::optional<int> ParseFlags(int argc, char** argv, AgentConfig& config) {
  config.name = Hostname();
  config.trainer = DefaultTrainer();
  config.python_dir = DefaultPythonDir();
  gradhub::Flags flags("gradhub-agent", kSummary);
  config.Register(flags);
  std::vector<std::string> args;
  if (std::optional<int> exit = flags.ParseOrExitCode(argc, argv, &args)) return *exit;
  gradhub::HideSecretFlagValues(argc, argv, {"--token"});  // ranks can read our cmdline
  if (!args.empty()) {
    std::cerr << flags.Usage();
    return 2;
  }
  if (config.master_port_base != 0 &&
      (config.master_port_base < 1024 || config.master_port_base > 65535)) {
    std::cerr << "gradhub-agent: --master-port-base: must be 0 or a port in [1024, 65535]\n";
    return 2;
  }
  if (config.job_uid_base < 1000 || config.job_uid_count < 1 ||
      config.job_uid_base + config.job_uid_count > int64_t{4294967294}) {
    std::cerr << "gradhub-agent: --job-uid-base/--job-uid-count: a range of uids above 999 and "
                 "below 4294967294\n";
    return 2;
  }
  if (config.fake_gpus < 0 || config.fake_gpus > 64) {
    std::cerr << "gradhub-agent: --fake-gpus: must be in [0, 64]\n";
    return 2;
  }
  return std::nullopt;
}

// The devices and the slots this node offers. Once, before anything that divides by the slots
// (the memory limit per slot): the GPUs decide the kind and the default slots.
std::optional<int> DescribeDevices(AgentConfig& config) {
  config.devices = gradhub::agent::DiscoverNodeDevices(config.fake_gpus);
  auto node = gradhub::agent::DescribeNode(config);
  if (!node.ok()) {
    std::cerr << "gradhub-agent: " << node.status().message() << "\n";
    return 2;
  }
  config.slots = node->slots();
  std::cerr << "gradhub-agent: " << config.devices.summary << "; " << config.slots << " slot(s)\n";
  return std::nullopt;
}

// --work-dir (created) and --checkpoint-root as absolute paths: ranks start in other
// directories.
std::optional<int> ResolveDirectories(AgentConfig& config) {
  std::error_code error;
  config.work_dir = std::filesystem::absolute(config.work_dir, error).lexically_normal().string();
  std::filesystem::create_directories(config.work_dir, error);
  if (error) {
    std::cerr << "gradhub-agent: --work-dir " << config.work_dir << ": " << error.message() << "\n";
    return 1;
  }
  if (!config.checkpoint_root.empty()) {
    config.checkpoint_root =
        std::filesystem::absolute(config.checkpoint_root, error).lexically_normal().string();
  }
  return std::nullopt;
}

// The ranks' user and cgroups. After --work-dir is absolute: that user must be able to enter it.
std::optional<int> IsolateRanks(AgentConfig& config) {
  auto isolation = gradhub::agent::SetUpIsolation(config);
  if (!isolation.ok()) {
    std::cerr << "gradhub-agent: " << isolation.status().message() << "\n";
    return 2;
  }
  config.isolation = *std::move(isolation);
  std::cerr << "gradhub-agent: " << gradhub::agent::DescribeIsolation(config.isolation) << "\n";
  if (const int removed = gradhub::agent::RemoveLeftoverCgroups(config.isolation.cgroup_dir);
      removed > 0) {
    std::cerr << "gradhub-agent: removed " << removed << " rank cgroup(s) a previous agent left\n";
  }
  return std::nullopt;
}

// --server as a channel target (api_targets.h). Waits for its names to resolve, which in a
// container they may only after it started; a list that does not parse ends the agent.
std::optional<int> ResolveServer(AgentConfig& config) {
  for (int tries = 0;; ++tries) {
    absl::StatusOr<gradhub::ApiTarget> target = gradhub::ParseApiTarget("--server", config.server);
    if (target.ok()) {
      config.api_target = *std::move(target);
      return std::nullopt;
    }
    if (target.status().code() != absl::StatusCode::kUnavailable) {
      std::cerr << "gradhub-agent: " << target.status().message() << "\n";
      return 2;
    }
    if (tries == 0) std::cerr << "gradhub-agent: " << target.status().message() << "; waiting\n";
    std::this_thread::sleep_for(std::chrono::seconds(1));
  }
}

// The address this node advertises and its ranks' network variables (node_address.h). Waits
// for a route to --server, which a container may get only after it started.
std::optional<int> ResolveAddress(AgentConfig& config) {
  const std::string api_host = gradhub::agent::TargetHost(config.server);
  const bool api_is_local = gradhub::agent::ResolvesToLoopback(api_host);
  std::string route_source;
  for (int tries = 0; config.address.empty() && route_source.empty(); ++tries) {
    absl::StatusOr<std::string> source = gradhub::agent::RouteSourceAddress(api_host);
    if (source.ok()) {
      route_source = *source;
    } else {
      if (tries == 0) {
        std::cerr << "gradhub-agent: " << source.status().message()
                  << "; waiting for a route to --server to pick this node's address\n";
      }
      std::this_thread::sleep_for(std::chrono::seconds(1));
    }
  }
  absl::StatusOr<std::string> address =
      gradhub::agent::ChooseAdvertisedAddress(config.address, api_is_local, route_source);
  if (!address.ok()) {
    std::cerr << "gradhub-agent: " << address.status().message() << "\n";
    return 2;
  }
  config.address = *address;
  const std::string interface = gradhub::agent::InterfaceOf(config.address);
  std::map<std::string, std::string> operator_env;
  for (const char* name : {"GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"}) {
    if (const char* value = std::getenv(name); value != nullptr) operator_env[name] = value;
  }
  config.rank_network_env =
      gradhub::agent::RankNetworkEnvironment(config.address, interface, operator_env);
  std::cerr << "gradhub-agent: advertising address " << config.address << " (interface "
            << (interface.empty() ? "unknown" : interface) << ")\n";
  return std::nullopt;
}

// What would make every rank or every call fail, said at start rather than per rank.
void WarnAboutSettings(const AgentConfig& config) {
  if (access(config.trainer.c_str(), X_OK) != 0) {
    std::cerr << "gradhub-agent: warning: --trainer " << config.trainer
              << " is not executable; every rank started here will fail\n";
  }
  if (config.token.empty()) {
    std::cerr << "gradhub-agent: warning: no --token (GRADHUB_NODE_TOKEN); the server will "
                 "refuse this agent\n";
  }
}

// Runs the agent until SIGTERM or SIGINT has stopped its ranks. Its cgroup directory goes when
// it ends (every rank's cgroup is gone by then).
int RunUntilSignal(const AgentConfig& config, const gradhub::ShutdownSignals& signals) {
  auto credentials =
      gradhub::ClientCredentials(config.tls_ca_file, config.tls_cert_file, config.tls_key_file);
  if (!credentials.ok()) {
    if (!config.isolation.cgroup_dir.empty()) rmdir(config.isolation.cgroup_dir.c_str());
    std::cerr << "gradhub-agent: " << credentials.status().message() << "\n";
    return 2;
  }
  // Heartbeats, WatchAssignments and log shipping share this channel: when its replica is
  // gone, each call or stream fails and is made again on the next one (api_targets.h).
  auto channel =
      gradhub::CreateApiChannel(config.api_target, *credentials, gradhub::kClusterConnectTimeout);
  auto stub = gradhub::v1::NodeService::NewStub(channel);
  gradhub::agent::Agent agent(config, stub.get());
  std::thread signal_thread([&] {
    const int received = signals.Wait();
    std::cerr << "gradhub-agent: signal " << received << ", stopping ranks and shutting down\n";
    agent.Shutdown();
  });
  agent.Run();
  signal_thread.join();
  if (!config.isolation.cgroup_dir.empty()) rmdir(config.isolation.cgroup_dir.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  gradhub::TurnOffMutexDeadlockDetection();
  AgentConfig config;
  if (std::optional<int> exit = ParseFlags(argc, argv, config)) return *exit;
  for (auto prepare :
       {DescribeDevices, ResolveDirectories, ResolveServer, ResolveAddress, IsolateRanks}) {
    if (std::optional<int> exit = prepare(config)) return *exit;
  }
  WarnAboutSettings(config);
  // Before any other thread exists (rank processes get a clean mask again, see rank_process.h).
  const gradhub::ShutdownSignals signals;
  return RunUntilSignal(config, signals);
}
