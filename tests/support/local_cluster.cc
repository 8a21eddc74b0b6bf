#include "tests/support/local_cluster.h"

#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <dirent.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <regex>
#include <sstream>
#include <thread>

#include "gradhub/v1/code.grpc.pb.h"
#include "services/common/code_archive/code_archive.h"
#include "tests/support/ports.h"
#include "tests/support/postgres_server.h"

namespace gradhub::testing {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::seconds;

std::string Tail(const std::string& text, size_t bytes) {
  return text.substr(text.size() > bytes ? text.size() - bytes : 0);
}

// Pids of the gradhub-trainer processes whose parent is `parent`.
// Live children of `parent` whose command name starts with `name` ("" = any).
std::vector<pid_t> ChildrenNamed(pid_t parent, const std::string& name) {
  std::vector<pid_t> pids;
  DIR* proc = opendir("/proc");
  while (dirent* entry = readdir(proc)) {
    const pid_t pid = atoi(entry->d_name);
    if (pid <= 0) continue;
    std::ifstream stat("/proc/" + std::string(entry->d_name) + "/stat");
    std::string line;
    std::getline(stat, line);
    const size_t close = line.rfind(')');
    if (close == std::string::npos || line.find("(" + name) == std::string::npos) continue;
    std::istringstream rest(line.substr(close + 2));
    std::string state;
    pid_t ppid = 0;
    rest >> state >> ppid;
    if (ppid == parent && state != "Z") pids.push_back(pid);
  }
  closedir(proc);
  return pids;
}

std::unique_ptr<grpc::ClientContext> ContextWith(const std::string& token) {
  auto context = std::make_unique<grpc::ClientContext>();
  context->AddMetadata("authorization", "Bearer " + token);
  context->set_deadline(std::chrono::system_clock::now() + seconds(10));
  return context;
}

}  // namespace

std::string AwaitOutput(Subprocess& process, const std::string& pattern, seconds limit) {
  const std::regex re(pattern);
  const auto deadline = Clock::now() + limit;
  while (Clock::now() < deadline && process.running()) {
    std::smatch match;
    const std::string out = process.out();
    if (std::regex_search(out, match, re))
      return match.size() > 1 ? match[1].str() : match[0].str();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ADD_FAILURE() << "no '" << pattern << "' in output:\n" << process.out() << "\n" << process.err();
  return "";
}

bool Ended(const v1::Job& job) {
  return job.state() == v1::Job::SUCCEEDED || job.state() == v1::Job::FAILED ||
         job.state() == v1::Job::CANCELLED;
}

LocalCluster::LocalCluster(LocalClusterOptions options) : options_(std::move(options)) {}

LocalCluster::~LocalCluster() {
  if (!::testing::Test::HasFailure()) return;
  for (const auto& [name, agent] : agents_) {
    std::cerr << "--- agent " << name << " stderr (tail):\n" << Tail(agent->err(), 4000) << "\n";
  }
  if (metrics_) {
    std::cerr << "--- metrics stderr (tail):\n" << Tail(metrics_->err(), 3000) << "\n";
  }
  if (checkpoint_) {
    std::cerr << "--- checkpoint stdout+stderr (tail):\n"
              << Tail(checkpoint_->out(), 2000) << Tail(checkpoint_->err(), 3000) << "\n";
  }
  if (api_) std::cerr << "--- api stderr (tail):\n" << Tail(api_->err(), 3000) << "\n";
  for (size_t i = 0; i < api_replicas_.size(); ++i) {
    if (api_replicas_[i] == nullptr) continue;
    std::cerr << "--- api replica " << i + 1 << " stderr (tail):\n"
              << Tail(api_replicas_[i]->err(), 3000) << "\n";
  }
}

bool LocalCluster::Start() {
  chmod(dir().c_str(), 0711);  // the ranks' user enters its directories below
  url_ = PostgresServer::Shared().CreateDatabase();
  for (int* port : {&api_grpc_port_, &api_http_port_, &checkpoint_grpc_port_,
                    &checkpoint_http_port_, &metrics_grpc_port_, &metrics_http_port_}) {
    if (*port == 0) *port = PortBelowEphemeralRange();
  }
  for (int replica = 1; replica < options_.api_replicas; ++replica) {
    replica_grpc_ports_.push_back(PortBelowEphemeralRange());
  }
  if (!StartApi()) return false;
  for (int replica = 1; replica < options_.api_replicas; ++replica) {
    if (!StartApiReplica(replica)) return false;
  }
  auto tenant = Run({BinaryPath("gradhub-api"), "--database-url", url_, "create-tenant", "team"});
  auto node = Run({BinaryPath("gradhub-api"), "--database-url", url_, "create-node-token"});
  EXPECT_EQ(tenant.exit_code, 0) << tenant.err;
  EXPECT_EQ(node.exit_code, 0) << node.err;
  token_ = tenant.out.substr(0, tenant.out.find('\n'));
  node_token_ = node.out.substr(0, node.out.find('\n'));
  // With every replica given to clients, the test's own calls fail over as theirs do (pick_first
  // over the list; ServiceHost() is an address).
  auto channel = grpc::CreateChannel(
      options_.clients_use_every_replica ? "ipv4:" + api_addresses() : api_address_,
      grpc::InsecureChannelCredentials());
  jobs_ = v1::JobService::NewStub(channel);
  nodes_ = v1::NodeService::NewStub(channel);
  checkpoint_data_ = dir() + "/checkpoint-store";
  if (options_.checkpoint_service && !StartCheckpointService()) return false;
  if (options_.metrics_service && !StartMetricsService()) return false;
  for (const std::string& name : options_.agents) {
    if (!StartAgent(name)) return false;
  }
  return true;
}

std::string LocalCluster::ServiceHost() const {
  return options_.network != nullptr ? options_.network->hub_address() : "127.0.0.1";
}

std::unique_ptr<Subprocess> LocalCluster::LaunchApi(int* grpc_port, int* http_port) {
  std::vector<std::string> argv = {BinaryPath("gradhub-api"),
                                   "--database-url",
                                   url_,
                                   "--grpc-address",
                                   ServiceHost() + ":" + std::to_string(*grpc_port),
                                   "--http-host",
                                   ServiceHost(),
                                   "--http-port",
                                   std::to_string(*http_port),
                                   "--heartbeat-interval",
                                   options_.heartbeat_interval,
                                   "--scheduler-interval",
                                   "100ms",
                                   "--shutdown-grace",
                                   "2s",
                                   "--admin-token",
                                   kAdminToken,
                                   "--node-outage-grace",
                                   options_.agent_api_outage_grace};
  // Trainers reach the rendezvous store on whichever replica is up.
  if (options_.clients_use_every_replica)
    argv.insert(argv.end(), {"--store-address", api_addresses()});
  argv.push_back("serve");
  auto api = std::make_unique<Subprocess>(std::move(argv));
  const std::string port = AwaitOutput(*api, "serving gRPC on port ([0-9]+)");
  const std::string http = AwaitOutput(*api, "serving REST on port ([0-9]+)");
  if (port.empty() || http.empty()) return nullptr;
  *grpc_port = std::stoi(port);
  *http_port = std::stoi(http);
  return api;
}

// The first start takes free ports; a restart keeps them, as a real restart would.
bool LocalCluster::StartApi() {
  api_ = LaunchApi(&api_grpc_port_, &api_http_port_);
  if (api_ == nullptr) return false;
  api_address_ = ServiceHost() + ":" + std::to_string(api_grpc_port_);
  return true;
}

bool LocalCluster::StartApiReplica(int replica) {
  int grpc_port = replica <= static_cast<int>(replica_grpc_ports_.size())
                      ? replica_grpc_ports_[replica - 1]
                      : PortBelowEphemeralRange();
  int http_port = PortBelowEphemeralRange();
  std::unique_ptr<Subprocess> api = LaunchApi(&grpc_port, &http_port);
  if (api == nullptr) return false;
  api_replicas_.resize(std::max<size_t>(api_replicas_.size(), replica));
  api_replica_addresses_.resize(api_replicas_.size());
  api_replicas_[replica - 1] = std::move(api);
  api_replica_addresses_[replica - 1] = ServiceHost() + ":" + std::to_string(grpc_port);
  return true;
}

const std::string& LocalCluster::api_address(int replica) const {
  return replica == 0 ? api_address_ : api_replica_addresses_.at(replica - 1);
}

void LocalCluster::KillApi(int signal) {
  api_->Kill(signal);
  api_->Wait();
}

void LocalCluster::SignalApi(int signal) { api_->Kill(signal); }

void LocalCluster::SignalApiReplica(int replica, int signal) {
  (replica == 0 ? api_ : api_replicas_.at(replica - 1))->Kill(signal);
}

void LocalCluster::KillApiReplica(int replica, int signal) {
  Subprocess& api = *(replica == 0 ? api_ : api_replicas_.at(replica - 1));
  api.Kill(signal);
  api.Wait();
}

bool LocalCluster::RestartApiReplica(int replica) {
  return replica == 0 ? StartApi() : StartApiReplica(replica);
}

pid_t LocalCluster::ApiReplicaPid(int replica) const {
  return (replica == 0 ? api_ : api_replicas_.at(replica - 1))->pid();
}

// From the ports (known before any replica started), so that replica 0's flags can name them.
std::string LocalCluster::api_addresses() const {
  std::string list = ServiceHost() + ":" + std::to_string(api_grpc_port_);
  for (int port : replica_grpc_ports_) list += "," + ServiceHost() + ":" + std::to_string(port);
  return list;
}

// As the api: free ports first, the same ones on a restart.
bool LocalCluster::StartCheckpointService() {
  checkpoint_ = std::make_unique<Subprocess>(std::vector<std::string>{
      BinaryPath("gradhub-checkpoint"), "--database-url", url_, "--data-dir", checkpoint_data_,
      "--grpc-port", std::to_string(checkpoint_grpc_port_), "--http-port",
      std::to_string(checkpoint_http_port_), "--admin-token", kAdminToken});
  const std::string grpc_port = AwaitOutput(*checkpoint_, "serving gRPC on port ([0-9]+)");
  const std::string http_port = AwaitOutput(*checkpoint_, "serving (?:REST|HTTP) on port ([0-9]+)");
  if (grpc_port.empty() || http_port.empty()) return false;
  checkpoint_grpc_port_ = std::stoi(grpc_port);
  checkpoint_http_port_ = std::stoi(http_port);
  checkpoint_address_ = ServiceHost() + ":" + grpc_port;
  if (!checkpoints_) {
    checkpoints_ = v1::CheckpointService::NewStub(
        grpc::CreateChannel(checkpoint_address_, grpc::InsecureChannelCredentials()));
  }
  return true;
}

void LocalCluster::KillCheckpointService(int signal) {
  checkpoint_->Kill(signal);
  checkpoint_->Wait();
}

// As the checkpoint service: free ports first, the same ones on a restart.
bool LocalCluster::StartMetricsService() {
  metrics_ = std::make_unique<Subprocess>(std::vector<std::string>{
      BinaryPath("gradhub-metrics"), "--database-url", url_, "--grpc-port",
      std::to_string(metrics_grpc_port_), "--http-port", std::to_string(metrics_http_port_),
      "--admin-token", kAdminToken, "--job-check-interval", "1s"});
  const std::string grpc_port = AwaitOutput(*metrics_, "serving gRPC on port ([0-9]+)");
  const std::string http_port = AwaitOutput(*metrics_, "serving HTTP on port ([0-9]+)");
  if (grpc_port.empty() || http_port.empty()) return false;
  metrics_grpc_port_ = std::stoi(grpc_port);
  metrics_http_port_ = std::stoi(http_port);
  return true;
}

void LocalCluster::KillMetricsService(int signal) {
  metrics_->Kill(signal);
  metrics_->Wait();
}

std::string LocalCluster::ScrapeMetrics() const {
  httplib::Client client("127.0.0.1", metrics_http_port_);
  client.set_read_timeout(5, 0);
  auto response = client.Get("/metrics");
  return response && response->status == 200 ? response->body : "";
}

bool LocalCluster::StartAgent(const std::string& name) {
  const std::string work = dir() + "/agent-" + name;
  std::vector<std::string> argv = {
      BinaryPath("gradhub-agent"),
      "--server",
      options_.clients_use_every_replica ? api_addresses() : api_address_,
      "--token",
      node_token_,
      "--name",
      name,
      "--slots",
      options_.fake_gpus > 0 ? "-1" : std::to_string(options_.slots),
      "--fake-gpus",
      std::to_string(options_.fake_gpus),
      "--work-dir",
      work,
      "--stop-grace",
      options_.agent_stop_grace,
      "--api-outage-grace",
      options_.agent_api_outage_grace,
      "--checkpoint-root",
      work + "/checkpoints"};
  if (options_.checkpoint_service) {
    argv.insert(argv.end(),
                {"--checkpoint-server", checkpoint_address_, "--checkpoint-url",
                 "http://" + ServiceHost() + ":" + std::to_string(checkpoint_http_port_)});
  }
  // Agents of one test (and tests run at once) share this machine: a MASTER_PORT range each,
  // picked at random below the ephemeral ports (32768-), checked by the agent when rank 0 starts.
  std::random_device random;
  argv.insert(argv.end(), {"--master-port-base",
                           std::to_string(20000 + 64 * static_cast<int>(random() % 190))});
  // The agent's default rank user where `make setup` created it, else nobody.
  if (geteuid() == 0 && getpwnam("gradhub-rank") == nullptr) {
    argv.insert(argv.end(), {"--run-as", "nobody"});
  }
  for (const std::string& root : options_.data_roots) {
    argv.insert(argv.end(), {"--data-root", root});
  }
  for (const std::string& root : options_.tenant_data_roots) {
    argv.insert(argv.end(), {"--tenant-data-root", root});
  }
  if (!options_.memory_per_slot.empty()) {
    argv.insert(argv.end(), {"--memory-per-slot", options_.memory_per_slot});
  }
  if (!options_.memory_isolation.empty()) {
    argv.insert(argv.end(), {"--memory-isolation", options_.memory_isolation});
  }
  if (options_.metrics_service) {
    argv.insert(
        argv.end(),
        {"--metrics-server", ServiceHost() + ":" + std::to_string(metrics_grpc_port_),
         "--metrics-url", "http://" + ServiceHost() + ":" + std::to_string(metrics_http_port_)});
  }
  if (options_.network != nullptr) {
    argv = options_.network->Command(
        name, std::move(argv),
        {.hostname_resolves_to_loopback = options_.hostnames_resolve_to_loopback});
  }
  agents_[name] = std::make_unique<Subprocess>(argv, options_.agent_environment);
  return !AwaitOutput(*agents_[name], "registered as nodes/" + name).empty();
}

void LocalCluster::KillAgent(const std::string& name, int signal) {
  agents_.at(name)->Kill(signal);
  agents_.at(name)->Wait();
}

std::string LocalCluster::AgentStderr(const std::string& name) const {
  const auto agent = agents_.find(name);
  return agent == agents_.end() || agent->second == nullptr ? "" : agent->second->err();
}

std::vector<pid_t> TrainerChildren(pid_t parent) { return ChildrenNamed(parent, "gradhub-traine"); }

std::vector<pid_t> LocalCluster::TrainersOf(const std::string& name) const {
  return TrainerChildren(agents_.at(name)->pid());
}

std::vector<pid_t> LocalCluster::RanksOf(const std::string& name) const {
  return ChildrenNamed(agents_.at(name)->pid(), "");
}

pid_t LocalCluster::AgentPid(const std::string& name) const { return agents_.at(name)->pid(); }

std::string LocalCluster::AgentRunningTrainers() const {
  for (const auto& [name, agent] : agents_) {
    if (agent->running() && !TrainerChildren(agent->pid()).empty()) return name;
  }
  return "";
}

std::unique_ptr<grpc::ClientContext> LocalCluster::TenantContext() const {
  return ContextWith(token_);
}
std::unique_ptr<grpc::ClientContext> LocalCluster::AdminContext() const {
  return ContextWith(kAdminToken);
}

v1::Job LocalCluster::Submit(const v1::JobSpec& spec) { return SubmitAs(token_, spec); }

v1::Job LocalCluster::SubmitAs(const std::string& token, const v1::JobSpec& spec) {
  v1::CreateJobRequest request;
  *request.mutable_spec() = spec;
  v1::Job job;
  const grpc::Status status = jobs_->CreateJob(ContextWith(token).get(), request, &job);
  EXPECT_TRUE(status.ok()) << status.error_message();
  return job;
}

std::string LocalCluster::UploadCode(const std::map<std::string, std::string>& files,
                                     const std::string& token) {
  const std::string dir = this->dir() + "/code-" + std::to_string(uploads_++);
  std::filesystem::create_directories(dir);
  for (const auto& [name, text] : files) std::ofstream(dir + "/" + name) << text;
  const std::string archive = dir + ".tar";
  EXPECT_TRUE(code::PackDirectory(dir, archive).ok());
  std::ifstream in(archive, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), {});
  auto stub = v1::CodeService::NewStub(
      grpc::CreateChannel(checkpoint_address_, grpc::InsecureChannelCredentials()));
  auto context = ContextWith(token.empty() ? token_ : token);
  v1::CodeArchive uploaded;
  auto writer = stub->UploadCode(context.get(), &uploaded);
  v1::UploadCodeRequest header;
  header.mutable_header()->set_size_bytes(static_cast<int64_t>(bytes.size()));
  writer->Write(header);
  v1::UploadCodeRequest data;
  data.set_data(bytes);
  writer->Write(data);
  writer->WritesDone();
  const grpc::Status status = writer->Finish();
  EXPECT_TRUE(status.ok()) << status.error_message();
  return uploaded.digest();
}

std::string LocalCluster::CreateTenant(const std::string& id) {
  auto tenant = Run({BinaryPath("gradhub-api"), "--database-url", url_, "create-tenant", id});
  EXPECT_EQ(tenant.exit_code, 0) << tenant.err;
  return tenant.out.substr(0, tenant.out.find('\n'));
}

grpc::Status LocalCluster::TryGet(const std::string& name, v1::Job* job) {
  v1::GetJobRequest request;
  request.set_name(name);
  return jobs_->GetJob(TenantContext().get(), request, job);
}

v1::Job LocalCluster::Get(const std::string& name) {
  v1::Job job;
  const grpc::Status status = TryGet(name, &job);
  EXPECT_TRUE(status.ok()) << name << ": " << status.error_message();
  return job;
}

// A read that fails on the way (a replica killed under the call) is only "not yet": the last
// successful one counts, and a failure only when none succeeded by the deadline.
v1::Job LocalCluster::AwaitJob(const std::string& name,
                               const std::function<bool(const v1::Job&)>& done, seconds limit) {
  const auto deadline = Clock::now() + limit;
  v1::Job job, read;
  grpc::Status last;
  bool seen = false;
  while (true) {
    last = TryGet(name, &read);
    if (last.ok()) {
      job = read;
      seen = true;
    }
    if ((seen && done(job)) || Clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(seen) << name << ": " << last.error_message();
  return job;
}

void LocalCluster::Cancel(const std::string& name) {
  v1::CancelJobRequest request;
  request.set_name(name);
  v1::Job cancelled;
  EXPECT_TRUE(jobs_->CancelJob(TenantContext().get(), request, &cancelled).ok());
}

std::vector<v1::JobEvent> LocalCluster::Events(const std::string& name) {
  v1::ListJobEventsRequest request;
  request.set_parent(name);
  request.set_page_size(1000);
  v1::ListJobEventsResponse response;
  EXPECT_TRUE(jobs_->ListJobEvents(TenantContext().get(), request, &response).ok());
  return {response.events().begin(), response.events().end()};
}

std::string LocalCluster::Describe(const std::string& name) {
  std::string text;
  for (const auto& e : Events(name)) text += e.ShortDebugString() + "\n";
  return text;
}

std::vector<std::string> LocalCluster::Logs(const std::string& name, int attempt, int rank) {
  v1::GetJobLogsRequest request;
  request.set_name(name);
  request.set_attempt(attempt);
  request.set_rank(rank);
  auto context = TenantContext();
  auto reader = jobs_->GetJobLogs(context.get(), request);
  std::vector<std::string> lines;
  v1::LogEntry line;
  while (reader->Read(&line)) lines.push_back(line.text());
  reader->Finish();
  return lines;
}

v1::Node LocalCluster::GetNode(const std::string& name) {
  v1::Node node;
  EXPECT_TRUE(TryGetNode(name, &node));
  return node;
}

bool LocalCluster::TryGetNode(const std::string& name, v1::Node* node) {
  v1::GetNodeRequest request;
  request.set_name("nodes/" + name);
  return nodes_->GetNode(AdminContext().get(), request, node).ok();
}

v1::Node::State LocalCluster::NodeState(const std::string& name) {
  v1::GetNodeRequest request;
  request.set_name("nodes/" + name);
  v1::Node node;
  EXPECT_TRUE(nodes_->GetNode(AdminContext().get(), request, &node).ok());
  return node.state();
}

bool LocalCluster::Drain(const std::string& name) {
  v1::DrainNodeRequest request;
  request.set_name("nodes/" + name);
  v1::Node node;
  const grpc::Status status = nodes_->DrainNode(AdminContext().get(), request, &node);
  EXPECT_TRUE(status.ok()) << status.error_message();
  return status.ok();
}

bool LocalCluster::Cordon(const std::string& name, bool cordon) {
  v1::CordonNodeRequest request;
  request.set_name("nodes/" + name);
  request.set_cordon(cordon);
  v1::Node node;
  const grpc::Status status = nodes_->CordonNode(AdminContext().get(), request, &node);
  EXPECT_TRUE(status.ok()) << status.error_message();
  return status.ok();
}

}  // namespace gradhub::testing
