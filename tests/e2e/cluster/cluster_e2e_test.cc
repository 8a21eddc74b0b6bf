// The whole local cluster as real processes: PostgreSQL, gradhub-api (scheduler inside), two
// gradhub-agents with two CPU slots each, and the trainers they start, doing real Gloo
// allreduce and rendezvous through the api's StoreService.
#include <dirent.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>

#include "gpu_worker/trainer/job_spec.h"
#include "gradhub/v1/jobs.grpc.pb.h"
#include "gradhub/v1/nodes.grpc.pb.h"
#include "tests/support/postgres_server.h"
#include "tests/support/subprocess.h"

namespace gradhub {
namespace {

using std::chrono::seconds;
using testing::BinaryPath;
using testing::Subprocess;
using Clock = std::chrono::steady_clock;

// Waits for `pattern` in the process's stdout; returns its first group.
std::string AwaitOutput(Subprocess& process, const std::string& pattern, seconds limit = seconds(30)) {
  const std::regex re(pattern);
  const auto deadline = Clock::now() + limit;
  while (Clock::now() < deadline && process.running()) {
    std::smatch match;
    const std::string out = process.out();
    if (std::regex_search(out, match, re)) return match.size() > 1 ? match[1].str() : match[0].str();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ADD_FAILURE() << "no '" << pattern << "' in output:\n" << process.out() << "\n" << process.err();
  return "";
}

// Pids of the gradhub-trainer processes whose parent is `parent`.
std::vector<pid_t> TrainersOf(pid_t parent) {
  std::vector<pid_t> pids;
  DIR* proc = opendir("/proc");
  while (dirent* entry = readdir(proc)) {
    const pid_t pid = atoi(entry->d_name);
    if (pid <= 0) continue;
    std::ifstream stat("/proc/" + std::string(entry->d_name) + "/stat");
    std::string line;
    std::getline(stat, line);
    const size_t close = line.rfind(')');
    if (close == std::string::npos || line.find("(gradhub-traine") == std::string::npos) continue;
    std::istringstream rest(line.substr(close + 2));
    std::string state;
    pid_t ppid = 0;
    rest >> state >> ppid;
    if (ppid == parent && state != "Z") pids.push_back(pid);
  }
  closedir(proc);
  return pids;
}

constexpr char kAdmin[] = "cluster-e2e-admin";

class ClusterE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    url_ = testing::PostgresServer::Shared().CreateDatabase();
    api_ = std::make_unique<Subprocess>(std::vector<std::string>{
        BinaryPath("gradhub-api"), "--database-url", url_, "--grpc-address", "127.0.0.1:0",
        "--http-host", "127.0.0.1", "--http-port", "0", "--heartbeat-interval", "1s",
        "--scheduler-interval", "100ms", "--shutdown-grace", "2s", "--admin-token", kAdmin,
        "serve"});
    const std::string port = AwaitOutput(*api_, "serving gRPC on port ([0-9]+)");
    ASSERT_FALSE(port.empty());
    server_ = "127.0.0.1:" + port;
    auto tenant = testing::Run({BinaryPath("gradhub-api"), "--database-url", url_,
                                "create-tenant", "team"});
    ASSERT_EQ(tenant.exit_code, 0) << tenant.err;
    token_ = tenant.out.substr(0, tenant.out.find('\n'));
    auto node = testing::Run({BinaryPath("gradhub-api"), "--database-url", url_,
                              "create-node-token"});
    ASSERT_EQ(node.exit_code, 0) << node.err;
    node_token_ = node.out.substr(0, node.out.find('\n'));
    StartAgent("a");
    StartAgent("b");
    stub_ = v1::JobService::NewStub(grpc::CreateChannel(server_, grpc::InsecureChannelCredentials()));
    nodes_ = v1::NodeService::NewStub(grpc::CreateChannel(server_, grpc::InsecureChannelCredentials()));
  }

  v1::Node::State NodeState(const std::string& name) {
    grpc::ClientContext context;
    context.AddMetadata("authorization", std::string("Bearer ") + kAdmin);
    v1::GetNodeRequest request;
    request.set_name("nodes/" + name);
    v1::Node node;
    EXPECT_TRUE(nodes_->GetNode(&context, request, &node).ok());
    return node.state();
  }

  void Cancel(const std::string& name) {
    v1::CancelJobRequest request;
    request.set_name(name);
    v1::Job cancelled;
    auto context = Context();
    ASSERT_TRUE(stub_->CancelJob(context.get(), request, &cancelled).ok());
  }

  bool HasEvent(const std::string& name, v1::JobEvent::Type type, const std::string& node) {
    for (const auto& e : Events(name)) {
      if (e.type() == type && (node.empty() || e.node() == node)) return true;
    }
    return false;
  }

  void TearDown() override {
    if (!HasFailure()) return;
    for (const auto& [name, agent] : agents_) {
      const std::string err = agent->err();
      std::cerr << "--- agent " << name << " stderr (tail):\n"
                << err.substr(err.size() > 4000 ? err.size() - 4000 : 0) << "\n";
    }
    const std::string err = api_->err();
    std::cerr << "--- api stderr (tail):\n" << err.substr(err.size() > 3000 ? err.size() - 3000 : 0) << "\n";
  }

  void StartAgent(const std::string& name) {
    agents_[name] = std::make_unique<Subprocess>(std::vector<std::string>{
        BinaryPath("gradhub-agent"), "--server", server_, "--token", node_token_, "--name", name,
        "--slots", "2", "--work-dir", dir_.path() + "/agent-" + name, "--checkpoint-root",
        dir_.path() + "/checkpoints", "--stop-grace", "2s"});
    ASSERT_FALSE(AwaitOutput(*agents_[name], "registered as nodes/" + name).empty());
  }

  std::unique_ptr<grpc::ClientContext> Context() {
    auto context = std::make_unique<grpc::ClientContext>();
    context->AddMetadata("authorization", "Bearer " + token_);
    context->set_deadline(std::chrono::system_clock::now() + seconds(10));
    return context;
  }

  v1::Job Submit(int64_t max_steps, int hang_timeout_seconds = 60) {
    v1::CreateJobRequest request;
    *request.mutable_spec() = ParseJobSpec(
        "model: {mlp: {layers: [32, 64, 4]}}\n"
        "dataset: {synthetic: {numSamples: 4096, numFeatures: 32, numClasses: 4, noise: 0.5},"
        " validationFraction: 0.1}\n"
        "optimizer: {sgd: {lr: 0.05, momentum: 0.9}}\n"
        "batchSizePerRank: 16\n"
        "maxSteps: " + std::to_string(max_steps) + "\n"
        "logEverySteps: 10\n"
        "checkpoint: {everySteps: 25}\n"
        "distributed: {worldSize: 4, ranksPerNode: 2}\n"
        "maxRestarts: {infrastructure: 2, job: 2}\n"
        "hangTimeoutSeconds: " + std::to_string(hang_timeout_seconds) + "\n");
    v1::Job job;
    auto context = Context();
    const grpc::Status status = stub_->CreateJob(context.get(), request, &job);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return job;
  }

  v1::Job Get(const std::string& name) {
    v1::GetJobRequest request;
    request.set_name(name);
    v1::Job job;
    auto context = Context();
    EXPECT_TRUE(stub_->GetJob(context.get(), request, &job).ok());
    return job;
  }

  // Polls until `done(job)` or the limit; returns the last job seen.
  v1::Job AwaitJob(const std::string& name, const std::function<bool(const v1::Job&)>& done,
                   seconds limit = seconds(120)) {
    const auto deadline = Clock::now() + limit;
    v1::Job job = Get(name);
    while (!done(job) && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      job = Get(name);
    }
    return job;
  }

  std::vector<v1::JobEvent> Events(const std::string& name) {
    v1::ListJobEventsRequest request;
    request.set_parent(name);
    v1::ListJobEventsResponse response;
    auto context = Context();
    EXPECT_TRUE(stub_->ListJobEvents(context.get(), request, &response).ok());
    return {response.events().begin(), response.events().end()};
  }

  std::string Describe(const std::string& name) {
    std::string text;
    for (const auto& e : Events(name)) text += e.DebugString() + "\n";
    return text;
  }

  testing::TempDir dir_;
  std::string url_, server_, token_, node_token_;
  std::unique_ptr<Subprocess> api_;
  std::map<std::string, std::unique_ptr<Subprocess>> agents_;
  std::unique_ptr<v1::JobService::Stub> stub_;
  std::unique_ptr<v1::NodeService::Stub> nodes_;
};

bool Ended(const v1::Job& job) {
  return job.state() == v1::Job::SUCCEEDED || job.state() == v1::Job::FAILED ||
         job.state() == v1::Job::CANCELLED;
}

TEST_F(ClusterE2eTest, WorldFourJobSpansBothNodesSucceedsAndKeepsLogsPerRank) {
  const v1::Job job = AwaitJob(Submit(200).name(), Ended);
  ASSERT_EQ(job.state(), v1::Job::SUCCEEDED) << job.state_reason() << "\n" << Describe(job.name());
  EXPECT_EQ(job.attempt(), 1);
  bool both = false;
  for (const auto& e : Events(job.name())) {
    both |= e.message().find("nodes/a") != std::string::npos &&
            e.message().find("nodes/b") != std::string::npos;
  }
  EXPECT_TRUE(both) << Describe(job.name());

  // Logs outlive the processes: every rank's "done" line is in the api. Agents flush after
  // the exit, so allow them a moment.
  std::set<int> done_ranks;
  const auto deadline = Clock::now() + seconds(10);
  while (done_ranks.size() < 4 && Clock::now() < deadline) {
    v1::GetJobLogsRequest request;
    request.set_name(job.name());
    auto context = Context();
    auto reader = stub_->GetJobLogs(context.get(), request);
    v1::LogEntry line;
    while (reader->Read(&line)) {
      if (line.text().find("\"event\":\"done\"") != std::string::npos) done_ranks.insert(line.rank());
    }
    EXPECT_TRUE(reader->Finish().ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  EXPECT_EQ(done_ranks, (std::set<int>{0, 1, 2, 3}));
}

TEST_F(ClusterE2eTest, KilledTrainerRestartsTheAttemptWhichResumesFromACheckpoint) {
  const std::string name = Submit(100000).name();
  v1::Job running = AwaitJob(name, [](const v1::Job& j) {
    return Ended(j) || (j.state() == v1::Job::RUNNING && j.progress().step() >= 60);
  });
  ASSERT_EQ(running.state(), v1::Job::RUNNING) << running.state_reason();
  std::vector<pid_t> on_b = TrainersOf(agents_["b"]->pid());
  ASSERT_EQ(on_b.size(), 2u);
  ASSERT_EQ(kill(on_b[1], SIGKILL), 0);

  const v1::Job second = AwaitJob(name, [](const v1::Job& j) {
    return Ended(j) || (j.attempt() == 2 && j.state() == v1::Job::RUNNING);
  });
  ASSERT_EQ(second.attempt(), 2) << second.state_reason() << "\n" << Describe(name);
  EXPECT_EQ(second.job_restarts(), 1);
  bool named = false;
  for (const auto& e : Events(name)) {
    if (e.type() == v1::JobEvent::RANK_FAILED) {
      named = true;
      EXPECT_EQ(e.signal(), SIGKILL) << e.DebugString();
      EXPECT_EQ(e.node(), "nodes/b");
    }
  }
  EXPECT_TRUE(named) << Describe(name);
  // Every trainer of the first attempt on b is gone; b runs only attempt 2's two ranks.
  const std::vector<pid_t> now_on_b = TrainersOf(agents_["b"]->pid());
  EXPECT_EQ(now_on_b.size(), 2u);
  for (pid_t pid : on_b) {
    EXPECT_EQ(std::count(now_on_b.begin(), now_on_b.end(), pid), 0) << "attempt 1 rank " << pid;
  }

  // The new attempt resumed: its rank 0 says from which step.
  std::string resumed;
  const auto deadline = Clock::now() + seconds(30);
  while (resumed.empty() && Clock::now() < deadline) {
    v1::GetJobLogsRequest request;
    request.set_name(name);
    request.set_attempt(2);
    request.set_rank(0);
    auto context = Context();
    auto reader = stub_->GetJobLogs(context.get(), request);
    v1::LogEntry line;
    std::smatch match;
    static const std::regex kResumed("resumed from step ([0-9]+)");
    while (reader->Read(&line)) {
      if (std::regex_search(line.text(), match, kResumed)) resumed = match[1].str();
    }
    reader->Finish();
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  ASSERT_FALSE(resumed.empty()) << "attempt 2 did not resume from a checkpoint";
  EXPECT_GE(std::stoi(resumed), 25);

  // Cancel stops every rank, wherever it runs.
  {
    v1::CancelJobRequest request;
    request.set_name(name);
    v1::Job cancelled;
    auto context = Context();
    ASSERT_TRUE(stub_->CancelJob(context.get(), request, &cancelled).ok());
  }
  const auto gone_by = Clock::now() + seconds(10);
  while ((!TrainersOf(agents_["a"]->pid()).empty() || !TrainersOf(agents_["b"]->pid()).empty()) &&
         Clock::now() < gone_by) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(TrainersOf(agents_["a"]->pid()).empty());
  EXPECT_TRUE(TrainersOf(agents_["b"]->pid()).empty());
}

TEST_F(ClusterE2eTest, KilledAgentLosesItsNodeAndTheJobRunsAgainWhenItReturns) {
  const std::string name = Submit(100000).name();
  ASSERT_EQ(AwaitJob(name, [](const v1::Job& j) {
              return Ended(j) || (j.state() == v1::Job::RUNNING && j.progress().step() >= 20);
            }).state(),
            v1::Job::RUNNING);
  const std::vector<pid_t> trainers = TrainersOf(agents_["b"]->pid());
  ASSERT_EQ(trainers.size(), 2u);
  agents_["b"]->Kill(SIGKILL);
  agents_["b"]->Wait();
  const auto killed = Clock::now();

  // Its trainers die with it (PR_SET_PDEATHSIG) and the node is lost within the lease (3 s).
  while (NodeState("b") != v1::Node::LOST && Clock::now() - killed < seconds(10)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(NodeState("b"), v1::Node::LOST);
  EXPECT_LT(Clock::now() - killed, seconds(6));
  for (pid_t pid : trainers) EXPECT_NE(kill(pid, 0), 0) << "trainer " << pid << " outlived its agent";
  // World size 4 does not fit on node a alone: the job waits and says why.
  const v1::Job waiting = AwaitJob(name, [](const v1::Job& j) {
    return j.state() == v1::Job::RESTARTING &&
           j.state_reason().find("needs 4 slots") != std::string::npos;
  }, seconds(20));
  EXPECT_EQ(waiting.state(), v1::Job::RESTARTING) << waiting.state_reason() << Describe(name);
  EXPECT_EQ(waiting.infrastructure_restarts(), 1);

  StartAgent("b");
  const v1::Job again = AwaitJob(name, [](const v1::Job& j) {
    return Ended(j) || (j.attempt() == 2 && j.state() == v1::Job::RUNNING);
  });
  EXPECT_EQ(again.state(), v1::Job::RUNNING) << again.state_reason() << Describe(name);
  EXPECT_EQ(NodeState("b"), v1::Node::READY);
  Cancel(name);
}

TEST_F(ClusterE2eTest, StoppedRankIsCaughtByTheWatchdogAndTheJobRestarts) {
  const std::string name = Submit(100000, /*hang_timeout_seconds=*/5).name();
  ASSERT_EQ(AwaitJob(name, [](const v1::Job& j) {
              return Ended(j) || (j.state() == v1::Job::RUNNING && j.progress().step() >= 20);
            }).state(),
            v1::Job::RUNNING);
  const std::vector<pid_t> on_b = TrainersOf(agents_["b"]->pid());
  ASSERT_EQ(on_b.size(), 2u);
  ASSERT_EQ(kill(on_b[0], SIGSTOP), 0);
  const auto stopped = Clock::now();
  const v1::Job restarted = AwaitJob(name, [](const v1::Job& j) {
    return Ended(j) || j.attempt() == 2;
  }, seconds(60));
  EXPECT_EQ(restarted.attempt(), 2) << restarted.state_reason() << Describe(name);
  EXPECT_LT(Clock::now() - stopped, seconds(5 + 5));
  EXPECT_TRUE(HasEvent(name, v1::JobEvent::HANG_DETECTED, "")) << Describe(name);
  Cancel(name);
}

}  // namespace
}  // namespace gradhub
