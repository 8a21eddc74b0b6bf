// gradhub across hosts and through a failing network (issue 34): every agent on a host of its
// own (a network namespace, tests/support/network_hosts.h), the services on the hub, ranks
// talking over the bridge, never loopback. Each test breaks a link while a job trains and
// checks what the job, the api and the checkpoint store make of it; each job ends compared
// with an uninterrupted run of the same spec, bit for bit.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <iostream>
#include <map>
#include <memory>
#include <regex>
#include <string>
#include <thread>

#include "services/common/contract/job_spec.h"
#include "tests/e2e/checkpoint/checkpoint_checks.h"
#include "tests/support/local_cluster.h"
#include "tests/support/network_hosts.h"

namespace gradhub {
namespace {

using std::chrono::seconds;
using testing::Ended;
using testing::FinalParameters;
using ::testing::HasSubstr;
using testing::LocalCluster;
using testing::NetworkHosts;
using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// A job that trains long enough to outlive a cut of ~10 s (~5 ms a step at world 4 on this
// machine), checkpoints often, and whose loss stays well above 0 to the end, so that the
// parameters still move and a comparison of the end has teeth (see checkpoint_e2e_test).
v1::JobSpec Spec(int world, int64_t steps) {
  return ParseJobSpec(
      "model: {mlp: {layers: [32, 256, 256, 4]}}\n"
      "dataset: {synthetic: {numSamples: 65536, numFeatures: 32, numClasses: 4, noise: 5},"
      " validationFraction: 0.1}\n"
      "optimizer: {sgd: {lr: 0.01, momentum: 0.9}}\n"
      "batchSizePerRank: 16\n"
      "maxSteps: " +
      std::to_string(steps) +
      "\n"
      "logEverySteps: 20\n"
      "checkpoint: {everySteps: 100, keepLast: 3}\n"
      "distributed: {worldSize: " +
      std::to_string(world) +
      ", ranksPerNode: 2}\n"
      "maxRestarts: {infrastructure: 3, job: 0}\n"
      "hangTimeoutSeconds: 60\n");
}

class ManyHostsE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!NetworkHosts::Available(&why)) GTEST_SKIP() << why;
  }

  // Hosts a, b and c with an agent each (2 CPU slots), the services on the hub. Every agent's
  // hostname resolves to 127.0.1.1, as on a stock Debian machine.
  void Start(const std::string& outage_grace = "8s") {
    hosts_ = std::make_unique<NetworkHosts>(std::vector<std::string>{"a", "b", "c"});
    testing::LocalClusterOptions options;
    options.agents = {"a", "b", "c"};
    options.checkpoint_service = true;
    options.network = hosts_.get();
    options.hostnames_resolve_to_loopback = true;
    options.agent_api_outage_grace = outage_grace;
    cluster_ = std::make_unique<LocalCluster>(options);
    ASSERT_TRUE(cluster_->Start());
  }

  int ApiPort() const {
    const std::string& address = cluster_->api_address();
    return std::stoi(address.substr(address.rfind(':') + 1));
  }

  // The uninterrupted run's parameters, once per spec for the whole binary (the ring's order,
  // and so every bit, depends on the ranks, not on the hosts they land on).
  std::string Reference(const v1::JobSpec& spec) {
    static std::map<std::string, std::string> known;
    const std::string key = spec.SerializeAsString();
    if (known.count(key) == 0) {
      const v1::Job job = cluster_->AwaitJob(cluster_->Submit(spec).name(), Ended);
      EXPECT_EQ(job.state(), v1::Job::SUCCEEDED) << cluster_->Describe(job.name());
      EXPECT_EQ(job.attempt(), 1);
      known[key] = FinalParameters(*cluster_, job.name());
      EXPECT_GT(testing::FinalLoss(*cluster_, job.name()), 0.01);
    }
    return known[key];
  }

  v1::Job AwaitRunningPast(const std::string& name, int attempt, int64_t step) {
    return cluster_->AwaitJob(name, [&](const v1::Job& j) {
      return Ended(j) || (j.attempt() == attempt && j.state() == v1::Job::RUNNING &&
                          j.progress().step() > step);
    });
  }

  // Submits `spec` and waits until it trains past step 200; the job's name and the agents whose
  // trainers run it (none, with a test failure, when it never got there).
  std::pair<std::string, std::vector<std::string>> SubmitAndAwaitTraining(const v1::JobSpec& spec) {
    const std::string name = cluster_->Submit(spec).name();
    if (AwaitRunningPast(name, 1, 200).state() != v1::Job::RUNNING) {
      ADD_FAILURE() << cluster_->Describe(name);
      return {name, {}};
    }
    return {name, NodesRunning()};
  }

  // The agents whose trainers run `name` now.
  std::vector<std::string> NodesRunning() const {
    std::vector<std::string> nodes;
    for (const char* node : {"a", "b", "c"}) {
      if (!cluster_->TrainersOf(node).empty()) nodes.push_back(node);
    }
    return nodes;
  }

  // Every CHECKPOINT_COMMITTED of attempt `attempt` comes before the first event of a later
  // attempt: nothing of an attempt the api gave up on changed the store. Call it once the job
  // ended: its last checkpoint is then a later attempt's.
  void ExpectNoCommitAfterItWasSuperseded(const std::string& name, int attempt) {
    bool superseded = false;
    for (const v1::JobEvent& e : cluster_->Events(name)) {
      superseded |= e.attempt() > attempt;
      if (superseded && e.attempt() == attempt) {
        EXPECT_NE(e.type(), v1::JobEvent::CHECKPOINT_COMMITTED) << e.DebugString();
      }
    }
    // And the store agrees: the newest committed checkpoint is the last attempt's.
    const std::optional<v1::Checkpoint> newest = testing::NewestCommitted(*cluster_, name);
    ASSERT_TRUE(newest.has_value());
    EXPECT_GT(newest->attempt(), attempt) << newest->DebugString();
  }

  std::unique_ptr<NetworkHosts> hosts_;  // outlives the cluster, whose processes run on it
  std::unique_ptr<LocalCluster> cluster_;
};

// A job of 4 ranks on two hosts trains over their interfaces: each node advertises its
// host's address (the route to the api), never the 127.0.1.1 its hostname resolves to, and the
// gradients cross the bridge.
TEST_F(ManyHostsE2eTest, AJobAcrossHostsTrainsOverTheirInterfaces) {
  Start();
  for (const char* node : {"a", "b", "c"}) {
    EXPECT_EQ(cluster_->GetNode(node).address(), hosts_->address(node)) << node;
  }
  std::map<std::string, int64_t> before;
  for (const char* node : {"a", "b", "c"}) before[node] = hosts_->LinkBytes(node);
  const v1::JobSpec spec = Spec(4, 1000);
  const std::string reference = Reference(spec);
  EXPECT_EQ(reference.size(), 64u);
  // 1000 steps of ~270k float gradients in a ring of 4 over 2 hosts: each host's link carries
  // well over 1 GB; the control traffic is a few MB.
  int64_t crossed = 0;
  for (const char* node : {"a", "b", "c"}) {
    const int64_t bytes = hosts_->LinkBytes(node) - before[node];
    std::cout << "[ measured ] host " << node << ": " << bytes / 1e6 << " MB over its link"
              << std::endl;
    crossed += bytes;
  }
  EXPECT_GT(crossed, int64_t{1} << 30);
}

// Fault 1: the hosts of a job's two agents partitioned from each other mid-job. Collectives
// time out within the job's collective timeout (distributed.collectiveTimeoutSeconds, 5 s
// here; the agents keep their default), each rank probes its peers' nodes and says which it
// cannot reach, the attempt fails as INFRASTRUCTURE naming both nodes, and the next attempt
// keeps them apart (the third host has room): it resumes exactly.
TEST_F(ManyHostsE2eTest, APartitionBetweenTwoHostsFailsTheAttemptAndTheNextAvoidsIt) {
  Start();
  v1::JobSpec spec = Spec(4, 4000);
  spec.mutable_distributed()->set_collective_timeout_seconds(5);
  // The timeout cannot change the parameters: the other tests' uninterrupted run is the same.
  const std::string reference = Reference(Spec(4, 4000));
  const auto [name, pair] = SubmitAndAwaitTraining(spec);
  ASSERT_EQ(pair.size(), 2u);

  hosts_->Partition(pair[0], pair[1]);
  const auto cut_at = Clock::now();
  const v1::Job failed =
      cluster_->AwaitJob(name, [](const v1::Job& j) { return Ended(j) || j.attempt() == 2; });
  std::cout << "[ measured ] attempt 1 failed " << SecondsSince(cut_at)
            << " s into the partition (collective timeout 5 s, probe up to 3 s)" << std::endl;
  ASSERT_EQ(failed.attempt(), 2) << cluster_->Describe(name);
  EXPECT_EQ(failed.infrastructure_restarts(), 1);
  // Both ends named: the failed rank's node, and the node it could not reach.
  bool named = false;
  for (const v1::JobEvent& e : cluster_->Events(name)) {
    if (e.attempt() != 1 || e.type() != v1::JobEvent::RANK_FAILED) continue;
    std::cout << "[ reason   ] " << e.node() << ": " << e.message() << std::endl;
    EXPECT_EQ(e.failure_kind(), v1::JobEvent::INFRASTRUCTURE);
    const std::string other = e.node() == "nodes/" + pair[0] ? pair[1] : pair[0];
    named |= e.message().find(e.node() + " cannot reach nodes/" + other) != std::string::npos;
  }
  EXPECT_TRUE(named) << cluster_->Describe(name);
  const std::string described = cluster_->Describe(name);
  EXPECT_TRUE(described.find("kept nodes/" + pair[0] + " and nodes/" + pair[1] + " apart") !=
                  std::string::npos ||
              described.find("kept nodes/" + pair[1] + " and nodes/" + pair[0] + " apart") !=
                  std::string::npos)
      << described;

  const v1::Job job = cluster_->AwaitJob(name, Ended, seconds(180));
  EXPECT_EQ(job.state(), v1::Job::SUCCEEDED) << cluster_->Describe(name);
  EXPECT_EQ(job.attempt(), 2);
  EXPECT_EQ(FinalParameters(*cluster_, name), reference);
}

// Fault 2: one agent cut off from the api (its port dropped, both ways) for 5 s, longer than
// the lease (3 s) and shorter than the outage grace (8 s). Its ranks keep training with their
// peers, whose agent vouches for them, so the node is not lost: the job SUCCEEDS in the same
// attempt, bit for bit.
TEST_F(ManyHostsE2eTest, AnAgentCutOffFromTheApiWithinTheGraceKeepsItsAttempt) {
  Start();
  const v1::JobSpec spec = Spec(4, 4000);
  const std::string reference = Reference(spec);
  const auto [name, running] = SubmitAndAwaitTraining(spec);
  ASSERT_EQ(running.size(), 2u);
  const std::string cut = running[1];

  const int rule = hosts_->filter(cut).DropTcpEndpoint(hosts_->hub_address(), ApiPort());
  const auto cut_at = Clock::now();
  while (SecondsSince(cut_at) < 5) {
    EXPECT_NE(cluster_->NodeState(cut), v1::Node::LOST);
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
  EXPECT_EQ(cluster_->TrainersOf(cut).size(), 2u) << "its ranks stopped within the grace";
  hosts_->filter(cut).Lift(rule);

  const v1::Job job = cluster_->AwaitJob(name, Ended, seconds(180));
  EXPECT_EQ(job.state(), v1::Job::SUCCEEDED) << cluster_->Describe(name);
  EXPECT_EQ(job.attempt(), 1) << cluster_->Describe(name);
  EXPECT_EQ(cluster_->NodeState(cut), v1::Node::READY);
  EXPECT_EQ(FinalParameters(*cluster_, name), reference);
}

// Fault 3: the same cut for longer than the grace. The agent stops its ranks on its own, the
// api gives up on the node once the grace is over and the attempt restarts on the other two
// hosts. The link heals late: the agent registers again, and nothing of the old attempt was
// accepted once it was superseded. The end is bit for bit the uninterrupted run's.
TEST_F(ManyHostsE2eTest, AnAgentCutOffPastTheGraceStopsItsRanksAndTheJobMovesOn) {
  Start();
  const v1::JobSpec spec = Spec(4, 4000);
  const std::string reference = Reference(spec);
  const auto [name, running] = SubmitAndAwaitTraining(spec);
  ASSERT_EQ(running.size(), 2u);
  const std::string cut = running[1];

  const int rule = hosts_->filter(cut).DropTcpEndpoint(hosts_->hub_address(), ApiPort());
  const auto cut_at = Clock::now();
  while (!cluster_->TrainersOf(cut).empty() && SecondsSince(cut_at) < 30) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  const double stopped = SecondsSince(cut_at);
  std::cout << "[ measured ] the cut node's ranks stopped " << stopped << " s into the cut"
            << std::endl;
  EXPECT_TRUE(cluster_->TrainersOf(cut).empty());
  EXPECT_GE(stopped, 7.0);  // the grace, not the lease
  const v1::Job moved = AwaitRunningPast(name, 2, 0);
  ASSERT_EQ(moved.attempt(), 2) << cluster_->Describe(name);
  EXPECT_EQ(cluster_->NodeState(cut), v1::Node::LOST);
  for (const std::string& node : NodesRunning()) EXPECT_NE(node, cut);
  std::this_thread::sleep_for(seconds(3));  // the link stays down a while longer
  hosts_->filter(cut).Lift(rule);

  const v1::Job job = cluster_->AwaitJob(name, Ended, seconds(180));
  EXPECT_EQ(job.state(), v1::Job::SUCCEEDED) << cluster_->Describe(name);
  EXPECT_EQ(job.attempt(), 2);
  EXPECT_EQ(FinalParameters(*cluster_, name), reference);
  ExpectNoCommitAfterItWasSuperseded(name, 1);
  const auto healed = Clock::now();
  while (cluster_->NodeState(cut) != v1::Node::READY && SecondsSince(healed) < 20) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  EXPECT_EQ(cluster_->NodeState(cut), v1::Node::READY) << "the agent registers again";
}

// Fencing: a job whose ranks all run on one host, cut off from the api. Nothing vouches for
// the node, so the api gives up on it at the lease and restarts the job on another host, while
// the cut agent keeps its ranks running for its (long) grace: a straggler that goes on
// training and saving. The api revoked its ranks' tokens when it gave up on them, so the
// checkpoint store accepts none of its saves; the restarted job ends bit for bit.
TEST_F(ManyHostsE2eTest, AStragglerOfAnAttemptTheApiGaveUpOnChangesNothing) {
  Start(/*outage_grace=*/"30s");
  // Long enough that the straggler still trains when the api gives up on it (a lease, 3 s,
  // after the cut) and 4 s after that: both ranks on one host once ran 6,000 steps in less,
  // so attempt 1 finished and committed its final checkpoint before there was an attempt 2.
  const v1::JobSpec spec = Spec(2, 30000);
  const std::string reference = Reference(spec);
  const auto [name, running] = SubmitAndAwaitTraining(spec);
  ASSERT_EQ(running.size(), 1u);
  const std::string cut = running[0];

  const int rule = hosts_->filter(cut).DropTcpEndpoint(hosts_->hub_address(), ApiPort());
  const auto cut_at = Clock::now();
  const int64_t cut_step = cluster_->Get(name).progress().step();
  const v1::Job moved = AwaitRunningPast(name, 2, 0);
  ASSERT_EQ(moved.attempt(), 2) << cluster_->Describe(name);
  std::cout << "[ measured ] cut at step " << cut_step << " of " << spec.max_steps()
            << "; attempt 2 ran " << SecondsSince(cut_at) << " s later" << std::endl;
  // The straggler still trains (and tries to save every 100 steps) for a while.
  EXPECT_EQ(cluster_->TrainersOf(cut).size(), 2u);
  std::this_thread::sleep_for(seconds(4));
  EXPECT_EQ(cluster_->TrainersOf(cut).size(), 2u);
  hosts_->filter(cut).Lift(rule);

  const v1::Job job = cluster_->AwaitJob(name, Ended, seconds(180));
  EXPECT_EQ(job.state(), v1::Job::SUCCEEDED) << cluster_->Describe(name);
  EXPECT_EQ(job.attempt(), 2);
  EXPECT_EQ(FinalParameters(*cluster_, name), reference);
  ExpectNoCommitAfterItWasSuperseded(name, 1);
  // Its refused saves, in its own words (shipped once the link healed): the store no longer
  // takes its token (the sink retries a refusal until the save's deadline, grpc_retry.h).
  std::string refusal;
  const auto healed = Clock::now();
  while (refusal.empty() && SecondsSince(healed) < 20) {
    for (const std::string& line : cluster_->Logs(name, 1, 0)) {
      if (line.find("invalid bearer token") != std::string::npos) refusal = line;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  std::cout << "[ refused  ] " << refusal << std::endl;
  EXPECT_THAT(refusal, HasSubstr("StartUpload")) << "rank 0 of attempt 1 had no save refused";
}

// Fault 6: slow links. Every host's link capped (tc tbf, both ways) at 1 Gbit/s, then at
// 100 Mbit/s: the job is slower, and nothing else changes: heartbeats, checkpoints and the
// result (bit for bit the uncapped run's).
TEST_F(ManyHostsE2eTest, SlowLinksSlowTheJobAndChangeNothingElse) {
  Start();
  const v1::JobSpec spec = Spec(4, 300);
  auto timed_run = [&](const std::string& label) {
    const auto start = Clock::now();
    const v1::Job job = cluster_->AwaitJob(cluster_->Submit(spec).name(), Ended, seconds(240));
    std::cout << "[ measured ] " << label << ": " << SecondsSince(start) << " s from submit to end"
              << std::endl;
    EXPECT_EQ(job.state(), v1::Job::SUCCEEDED) << cluster_->Describe(job.name());
    EXPECT_EQ(job.attempt(), 1) << cluster_->Describe(job.name());
    return FinalParameters(*cluster_, job.name());
  };
  const std::string uncapped = timed_run("uncapped");
  ASSERT_EQ(uncapped.size(), 64u);
  for (const int64_t cap : {int64_t{1000} * 1000 * 1000, int64_t{100} * 1000 * 1000}) {
    for (const char* host : {"a", "b", "c"}) hosts_->CapBandwidth(host, cap);
    EXPECT_EQ(timed_run(std::to_string(cap / 1000000) + " Mbit/s"), uncapped);
  }
}

}  // namespace
}  // namespace gradhub
