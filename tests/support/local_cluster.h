// The whole platform as real processes for end-to-end tests: a database on the shared test
// PostgreSQL, gradhub-api (scheduler inside), optionally gradhub-checkpoint, and node agents
// whose trainers do real allreduce. One place for what every e2e suite used to start by hand.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gradhub/v1/checkpoint.grpc.pb.h"
#include "gradhub/v1/jobs.grpc.pb.h"
#include "gradhub/v1/nodes.grpc.pb.h"
#include "tests/support/network_hosts.h"
#include "tests/support/subprocess.h"

namespace gradhub::testing {

struct LocalClusterOptions {
  // Agents, started by Start() with `slots` CPU slots each. Empty: none; a test that must
  // arrange something first (which replica leads, say) then starts its own with StartAgent.
  std::vector<std::string> agents = {"a", "b"};
  int slots = 2;
  // > 0: every agent sees this many GPUs that are not there (gradhub-agent --fake-gpus) and
  // registers a CUDA node with its default slots, one per GPU (`slots` is then not passed).
  int fake_gpus = 0;
  // Start gradhub-checkpoint and hand it to the agents. Either way each agent has a checkpoint
  // root of its own (<dir>/agent-<name>/checkpoints: the service's cache, or the checkpoints
  // themselves), as separate machines would. One root shared by agents on one machine broke
  // when the second agent saw the first one's ranks run as the job's uid and picked another
  // for the job (before job_uids.h's rule 2 let a job's ranks share it across agents): rank 0
  // could lose its job's directory. A job restarted on another node resumes only through the
  // service, as between machines.
  bool checkpoint_service = false;
  // Start gradhub-metrics and hand it to the agents.
  bool metrics_service = false;
  std::string agent_stop_grace = "2s";
  // gradhub-api processes on the one database (issue 35), each on ports of its own. Replica 0
  // is the one api_address(), jobs(), the agents and the CLI use; the others are reached
  // through api_address(i).
  int api_replicas = 1;
  // The agents, the CLI and jobs() (Get, AwaitJob, Submit...) get every replica's address
  // (api_addresses()) rather than replica 0's, and every replica's --store-address is that list
  // (services/common/api_targets.h).
  bool clients_use_every_replica = false;
  // gradhub-api --heartbeat-interval (the lease is 3 of them).
  std::string heartbeat_interval = "1s";
  // How long agents keep their ranks running while gradhub-api is unreachable, and how long
  // the api keeps a silent node's ranks in jobs whose other ranks still run (its
  // --node-outage-grace).
  std::string agent_api_outage_grace = "60s";
  // Node isolation (gpu_worker/agent/isolation.h). Each agent's --data-root; the cluster's
  // dir() is made enterable (0711) so that ranks, which a root agent runs as gradhub-rank (or
  // nobody where `make setup` has not created it), reach their directories.
  std::vector<std::string> data_roots;
  // --memory-per-slot and --memory-isolation of every agent; empty = the agent's default.
  std::string memory_per_slot;
  std::string memory_isolation;
  // Each agent's --tenant-data-root, "TENANT=DIR".
  std::vector<std::string> tenant_data_roots;
  // Added to every agent's environment (a node's defaults: its ranks inherit, say,
  // GRADHUB_COLLECTIVE_TIMEOUT unless their job sets distributed.collectiveTimeoutSeconds).
  std::map<std::string, std::string> agent_environment;
  // Many hosts (tests/support/network_hosts.h; it must outlive the cluster): the services
  // listen on its hub's address, and each agent runs on the host of its name, where it finds
  // its own address (the route to the api), so its ranks talk to other hosts' over the bridge.
  NetworkHosts* network = nullptr;
  // On those hosts, the agents' (and their ranks') hostname resolves to 127.0.1.1, as on a
  // stock Debian machine.
  bool hostnames_resolve_to_loopback = false;
};

class LocalCluster {
 public:
  static constexpr char kAdminToken[] = "local-cluster-admin";

  explicit LocalCluster(LocalClusterOptions options = {});
  ~LocalCluster();  // prints the services' stderr tails when the test failed

  // Starts everything; ADD_FAILUREs (and returns false) when something does not come up.
  bool Start();
  // gradhub-api alone: Start() runs it; after KillApi, StartApi brings it back on the same
  // ports (as a restarted deployment would be), against the same database.
  bool StartApi();
  void KillApi(int signal);
  // Sends `signal` to gradhub-api without waiting for it to exit: SIGSTOP and SIGCONT pause
  // and continue it, as a frozen VM or a long stall would.
  void SignalApi(int signal);
  // Replicas 1.. (LocalClusterOptions::api_replicas), started by Start() after replica 0.
  bool StartApiReplica(int replica);
  // SignalApi for replica `replica` (0 = the one KillApi and SignalApi reach).
  void SignalApiReplica(int replica, int signal);
  // Replica `replica` (0 = the first) killed with `signal` and reaped; RestartApiReplica brings
  // it back on its gRPC port. ApiReplicaPid: its process, to match the leader's holder id.
  void KillApiReplica(int replica, int signal);
  bool RestartApiReplica(int replica);
  pid_t ApiReplicaPid(int replica) const;
  bool StartAgent(const std::string& name);
  void KillAgent(const std::string& name, int signal);
  bool StartCheckpointService();
  void KillCheckpointService(int signal);
  bool StartMetricsService();
  void KillMetricsService(int signal);
  // GET of gradhub-metrics' /metrics (Prometheus text); "" when it does not answer.
  std::string ScrapeMetrics() const;

  // Pids of the gradhub-trainer processes that agent `name` started.
  std::vector<pid_t> TrainersOf(const std::string& name) const;
  // Pids of every rank process (trainer or script) agent `name` started, and its own pid.
  std::vector<pid_t> RanksOf(const std::string& name) const;
  pid_t AgentPid(const std::string& name) const;
  // The agent whose trainers run job ranks now ("" if none).
  std::string AgentRunningTrainers() const;

  v1::Job Submit(const v1::JobSpec& spec);
  // CreateJob as another tenant (its token, from CreateTenant).
  v1::Job SubmitAs(const std::string& token, const v1::JobSpec& spec);
  // Packs `files` (name -> text) into a code archive and uploads it (CodeService) as the tenant
  // of `token` ("" = the cluster's tenant); returns its digest, "sha256:...".
  std::string UploadCode(const std::map<std::string, std::string>& files,
                         const std::string& token = "");
  // A new tenant `id` (gradhub-api create-tenant); returns its token.
  std::string CreateTenant(const std::string& id);
  v1::Job Get(const std::string& name);  // a failed read is a test failure
  grpc::Status TryGet(const std::string& name, v1::Job* job);
  // Polls until `done(job)` or the limit; returns the last job seen. A failed read is retried
  // (a replica killed under it), and fails the test only if no read succeeded at all.
  v1::Job AwaitJob(const std::string& name, const std::function<bool(const v1::Job&)>& done,
                   std::chrono::seconds limit = std::chrono::seconds(120));
  void Cancel(const std::string& name);
  std::vector<v1::JobEvent> Events(const std::string& name);
  std::string Describe(const std::string& name);  // every event, for failure messages
  // Every log line so far of one rank of one attempt (0 = the latest attempt).
  std::vector<std::string> Logs(const std::string& name, int attempt, int rank);
  v1::Node::State NodeState(const std::string& name);
  v1::Node GetNode(const std::string& name);  // as an operator sees it (admin token)
  // GetNode that may fail (an api still starting): false then, without failing the test.
  bool TryGetNode(const std::string& name, v1::Node* node);
  // DrainNode as an operator would (admin token); false with a test failure if refused.
  bool Drain(const std::string& name);
  // CordonNode as an operator would: cordon=false makes a cordoned node READY again.
  bool Cordon(const std::string& name, bool cordon);

  // Contexts carrying the tenant's or the admin's token, with a 10 s deadline.
  std::unique_ptr<grpc::ClientContext> TenantContext() const;
  std::unique_ptr<grpc::ClientContext> AdminContext() const;

  const std::string& database_url() const { return url_; }
  const std::string& api_address() const { return api_address_; }
  // Replica `replica`'s gRPC address (0 = api_address()).
  const std::string& api_address(int replica) const;
  // Every replica's address, comma-separated, as --server takes it.
  std::string api_addresses() const;
  int api_http_port() const { return api_http_port_; }
  int metrics_http_port() const { return metrics_http_port_; }
  const std::string& checkpoint_address() const { return checkpoint_address_; }
  const std::string& checkpoint_data_dir() const { return checkpoint_data_; }
  int checkpoint_http_port() const { return checkpoint_http_port_; }
  const std::string& tenant_token() const { return token_; }
  const std::string& node_token() const { return node_token_; }
  const std::string& dir() const { return dir_.path(); }
  v1::JobService::Stub& jobs() { return *jobs_; }
  v1::CheckpointService::Stub& checkpoints() { return *checkpoints_; }
  Subprocess* checkpoint_process() { return checkpoint_.get(); }
  // What agent `name` has printed on stderr so far ("" if there is no such agent).
  std::string AgentStderr(const std::string& name) const;

 private:
  // Where the services listen and are reached: 127.0.0.1, or the network's hub.
  std::string ServiceHost() const;
  // Starts one gradhub-api on these ports (0 = free ones, which are written back) and waits
  // until it serves; nullptr (and a test failure) when it does not.
  std::unique_ptr<Subprocess> LaunchApi(int* grpc_port, int* http_port);

  LocalClusterOptions options_;
  TempDir dir_;
  std::string url_, api_address_, token_, node_token_;
  int api_grpc_port_ = 0, api_http_port_ = 0;
  std::string checkpoint_address_, checkpoint_data_;
  int checkpoint_grpc_port_ = 0, checkpoint_http_port_ = 0;
  int metrics_grpc_port_ = 0, metrics_http_port_ = 0;
  std::unique_ptr<Subprocess> api_, checkpoint_, metrics_;
  // Replicas 1.. : their processes and gRPC addresses, by index - 1.
  std::vector<std::unique_ptr<Subprocess>> api_replicas_;
  std::vector<std::string> api_replica_addresses_;
  // gRPC ports of replicas 1.., picked before replica 0 starts (its --store-address names them).
  std::vector<int> replica_grpc_ports_;
  std::map<std::string, std::unique_ptr<Subprocess>> agents_;
  int uploads_ = 0;
  std::unique_ptr<v1::JobService::Stub> jobs_;
  std::unique_ptr<v1::NodeService::Stub> nodes_;
  std::unique_ptr<v1::CheckpointService::Stub> checkpoints_;
};

// Waits for `pattern` in the process's stdout; returns its first group ("" and a test
// failure after `limit`).
std::string AwaitOutput(Subprocess& process, const std::string& pattern,
                        std::chrono::seconds limit = std::chrono::seconds(30));

bool Ended(const v1::Job& job);

}  // namespace gradhub::testing
