// Clients fail over between gradhub-api replicas (issue 35; services/common/api_targets.h), as
// real processes: two replicas on one database, agents given both addresses (they stream from
// replica 0, the first). Replica 0 is SIGKILLed while a job runs:
//  1. each agent's next heartbeat is recorded (seen through replica 1) within 2 s;
//  2. the running job goes on in the same attempt and SUCCEEDS;
//  3. a job submitted afterwards by the CLI, given both addresses, runs to SUCCEEDED.
// And a job whose ranks are waiting in rendezvous on replica 0 (their peers on a paused agent
// not started yet) when it is SIGKILLed: the waits go on through replica 1 (the keys are in
// PostgreSQL), and the job starts and SUCCEEDS in its first attempt.
#include <google/protobuf/util/json_util.h>
#include <google/protobuf/util/time_util.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <iostream>
#include <regex>
#include <string>
#include <thread>

#include "gradhub/v1/nodes.grpc.pb.h"
#include "tests/support/job_specs.h"
#include "tests/support/local_cluster.h"

namespace gradhub {
namespace {

using Clock = std::chrono::steady_clock;
using testing::Ended;

// How long after `since` (wall clock, the api's too: one machine) node `name`'s heartbeat was
// first recorded, as replica `nodes` reports it; -1 when none within 10 s.
double SecondsToNextHeartbeat(testing::LocalCluster& cluster, v1::NodeService::Stub& nodes,
                              const std::string& name, google::protobuf::Timestamp since) {
  const auto limit = Clock::now() + std::chrono::seconds(10);
  while (Clock::now() < limit) {
    v1::GetNodeRequest request;
    request.set_name("nodes/" + name);
    v1::Node node;
    if (nodes.GetNode(cluster.AdminContext().get(), request, &node).ok() &&
        node.last_heartbeat_time() > since) {
      return google::protobuf::util::TimeUtil::DurationToNanoseconds(node.last_heartbeat_time() -
                                                                     since) /
             1e9;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return -1;
}

// `gradhub submit` of `spec` with every replica's address; the job's name ("" on failure).
std::string SubmitWithCli(testing::LocalCluster& cluster, const v1::JobSpec& spec) {
  std::string json;
  EXPECT_TRUE(google::protobuf::util::MessageToJsonString(spec, &json).ok());
  const std::string file = cluster.dir() + "/cli-job.json";
  std::ofstream(file) << json;
  testing::RunResult submitted =
      testing::Run({testing::BinaryPath("gradhub"), "--server", cluster.api_addresses(), "--token",
                    cluster.tenant_token(), "submit", "-f", file});
  EXPECT_EQ(submitted.exit_code, 0) << submitted.err;
  std::smatch match;
  return std::regex_search(submitted.out, match, std::regex("jobs/[0-9a-f-]+")) ? match.str() : "";
}

TEST(ApiFailoverE2eTest, AKilledReplicasAgentsAndClientsMoveOnToTheOther) {
  testing::LocalClusterOptions options;
  options.api_replicas = 2;
  options.clients_use_every_replica = true;
  testing::LocalCluster cluster(options);
  ASSERT_TRUE(cluster.Start());
  auto replica1 = v1::NodeService::NewStub(
      grpc::CreateChannel(cluster.api_address(1), grpc::InsecureChannelCredentials()));

  // Long enough to be running through the failover (hundreds of steps a second unloaded).
  const v1::Job job = cluster.Submit(testing::SyntheticTrainingSpec(/*max_steps=*/4000));
  const v1::Job running = cluster.AwaitJob(
      job.name(), [](const v1::Job& j) { return Ended(j) || j.state() == v1::Job::RUNNING; },
      std::chrono::seconds(30));
  ASSERT_EQ(running.state(), v1::Job::RUNNING) << cluster.Describe(job.name());

  const google::protobuf::Timestamp killed = google::protobuf::util::TimeUtil::GetCurrentTime();
  cluster.SignalApiReplica(0, SIGKILL);
  for (const std::string& agent : {"a", "b"}) {
    const double seconds = SecondsToNextHeartbeat(cluster, *replica1, agent, killed);
    std::cout << "[ measured ] replica 0 SIGKILLed to agent " << agent
              << "'s next heartbeat recorded (via replica 1): " << seconds << " s" << std::endl;
    EXPECT_GE(seconds, 0) << "no heartbeat within 10 s\n" << cluster.AgentStderr(agent);
    EXPECT_LT(seconds, 2.0) << cluster.AgentStderr(agent);
  }

  // Read through replica 1 from here on (replica 0 is gone): jobs() fails over too.
  auto await = [&](const std::string& name) {
    return cluster.AwaitJob(name, Ended, std::chrono::seconds(60));
  };
  const v1::Job finished = await(job.name());
  EXPECT_EQ(finished.state(), v1::Job::SUCCEEDED) << finished.DebugString();
  EXPECT_EQ(finished.attempt(), running.attempt()) << "restarted: " << finished.DebugString();

  const std::string name = SubmitWithCli(cluster, testing::SyntheticTrainingSpec(200));
  ASSERT_FALSE(name.empty());
  const v1::Job after = await(name);
  EXPECT_EQ(after.state(), v1::Job::SUCCEEDED) << after.DebugString();
}

TEST(ApiFailoverE2eTest, RanksInRendezvousOnAKilledReplicaStillStart) {
  testing::LocalClusterOptions options;
  options.api_replicas = 2;
  options.clients_use_every_replica = true;
  options.checkpoint_service = true;  // the job's last checkpoint goes there
  testing::LocalCluster cluster(options);
  ASSERT_TRUE(cluster.Start());
  // Agent b paused: the job is placed on both nodes (b's heartbeat is still fresh), but only
  // a's two ranks start, and they wait in rendezvous for b's (on replica 0, the first address).
  ASSERT_EQ(kill(cluster.AgentPid("b"), SIGSTOP), 0);
  const v1::Job job = cluster.Submit(testing::SyntheticTrainingSpec(/*max_steps=*/300));
  for (const auto limit = Clock::now() + std::chrono::seconds(30);
       cluster.TrainersOf("a").size() < 2 && Clock::now() < limit;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_EQ(cluster.TrainersOf("a").size(), 2u) << cluster.Describe(job.name());
  std::this_thread::sleep_for(std::chrono::seconds(2));  // in their rendezvous waits
  cluster.SignalApiReplica(0, SIGKILL);
  std::this_thread::sleep_for(std::chrono::seconds(1));
  ASSERT_EQ(kill(cluster.AgentPid("b"), SIGCONT), 0);

  const v1::Job finished = cluster.AwaitJob(job.name(), Ended, std::chrono::seconds(60));
  EXPECT_EQ(finished.state(), v1::Job::SUCCEEDED) << finished.DebugString();
  EXPECT_EQ(finished.attempt(), 1) << "the rendezvous did not survive: " << finished.DebugString();
}

}  // namespace
}  // namespace gradhub
