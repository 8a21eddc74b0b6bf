// Clients fail over between gradhub-api replicas (issue 35; services/common/api_targets.h), as
// real processes: two replicas on one database, agents and clients given both addresses. The
// replica killed is the standby, never the leader (the "a non-leader replica killed"),
// and it is the one the agents stream from and the ranks wait in rendezvous on. A leader's death
// also moves the scheduler (a takeover, the leader's work paused for up to a lease), and replica 0,
// started first, almost always leads: killing it would time a takeover and the failover together,
// and never show that a standby's death costs nothing. Leader kills are covered by
// leader_chaos_e2e_test and tests/bench/control_plane/run.sh.
//  1. Replica 1 made the leader (term T), replica 0 the standby: if replica 0 took the first
//     term, it is stopped with SIGTERM (which releases the term: replica 1 takes it at its next
//     tick, not a lease later) and started again. Only then are the agents started: given both
//     addresses, replica 0's first, they connect to it (pick_first) and stay, as their TCP
//     connections show (/proc); so do the ranks' rendezvous clients, given both too.
//  2. Replica 0 SIGKILLed while a job runs:
//     a. `gradhub get` of the job, given both addresses, answers within 2 s of its start;
//     b. each agent's next heartbeat is recorded (seen through replica 1) within 2 s;
//     c. the job goes on in the same attempt and SUCCEEDS;
//     d. replica 1 still leads in term T: a standby's death changes nothing in leadership.
//  3. Replica 0 SIGKILLed while a job's ranks wait in rendezvous on it (their peers on a paused
//     agent not started yet): the waits go on through replica 1 (the keys are in PostgreSQL),
//     and the job starts and SUCCEEDS in its first attempt, replica 1 still leading in term T.
#include <google/protobuf/util/time_util.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>

#include "gradhub/v1/nodes.grpc.pb.h"
#include "tests/support/control_plane_leader.h"
#include "tests/support/job_specs.h"
#include "tests/support/local_cluster.h"

namespace gradhub {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::seconds;
using testing::Ended;

// How long after `since` (wall clock, the api's too: one machine) node `name`'s heartbeat was
// first recorded, as replica `nodes` reports it; -1 when none within 10 s.
double SecondsToNextHeartbeat(testing::LocalCluster& cluster, v1::NodeService::Stub& nodes,
                              const std::string& name, google::protobuf::Timestamp since) {
  const auto limit = Clock::now() + seconds(10);
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

class ApiFailoverE2eTest : public ::testing::Test {
 protected:
  // Protocol step 1.
  void StartWithAgentsOnTheStandby(bool checkpoint_service) {
    testing::LocalClusterOptions options;
    options.api_replicas = 2;
    options.clients_use_every_replica = true;
    options.checkpoint_service = checkpoint_service;
    options.agents = {};  // started below, once replica 0 is the standby
    cluster_ = std::make_unique<testing::LocalCluster>(options);
    ASSERT_TRUE(cluster_->Start());
    db_ = testing::ConnectToDatabase(cluster_->database_url());
    ASSERT_NE(db_, nullptr);
    std::optional<testing::ApiLeader> leader = testing::AwaitApiTermAfter(*db_, 0, seconds(10));
    ASSERT_TRUE(leader.has_value()) << "no replica took a term";
    if (leader->pid == cluster_->ApiReplicaPid(0)) {
      // SIGTERM releases the term: replica 1 takes it at its next tick, not a lease later.
      cluster_->KillApiReplica(0, SIGTERM);
      leader = testing::AwaitApiTermAfter(*db_, leader->term, seconds(10));
      ASSERT_TRUE(leader.has_value()) << "replica 1 took no term after replica 0 stopped";
      ASSERT_TRUE(cluster_->RestartApiReplica(0));
    }
    term_ = leader->term;
    for (const char* name : {"a", "b"}) {
      ASSERT_TRUE(cluster_->StartAgent(name));
      EXPECT_TRUE(ConnectedToReplica(cluster_->AgentPid(name), 0)) << "agent " << name;
      EXPECT_FALSE(ConnectedToReplica(cluster_->AgentPid(name), 1)) << "agent " << name;
    }
    ExpectReplica1LeadsInTermT();
  }

  // Replica 1 holds term T, and replica 0 (dead or alive) holds none.
  void ExpectReplica1LeadsInTermT() {
    const std::optional<testing::ApiLeader> leader = testing::CurrentApiLeader(*db_);
    ASSERT_TRUE(leader.has_value()) << "no leader";
    EXPECT_EQ(leader->pid, cluster_->ApiReplicaPid(1)) << "replica 1 does not lead";
    EXPECT_NE(leader->pid, cluster_->ApiReplicaPid(0)) << "replica 0 leads";
    EXPECT_EQ(leader->term, term_) << "leadership changed";
  }

  // Whether process `pid` has a TCP connection established to replica `replica`'s gRPC port:
  // its socket inodes (/proc/PID/fd) looked up in its network namespace's table.
  bool ConnectedToReplica(pid_t pid, int replica) {
    const std::string& address = cluster_->api_address(replica);
    const int port = std::stoi(address.substr(address.rfind(':') + 1));
    std::set<std::string> sockets;
    std::error_code error;
    for (const auto& fd :
         std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/fd", error)) {
      const std::string target = std::filesystem::read_symlink(fd.path(), error).string();
      if (target.rfind("socket:[", 0) == 0) sockets.insert(target.substr(8, target.size() - 9));
    }
    for (const char* family : {"tcp", "tcp6"}) {  // gRPC's IPv4 sockets may be IPv6 ones
      std::ifstream table("/proc/" + std::to_string(pid) + "/net/" + family);
      std::string line;
      std::getline(table, line);  // the header
      while (std::getline(table, line)) {
        std::istringstream fields(line);
        std::string slot, local, remote, state, queues, timer, retransmits, uid, timeout, inode;
        fields >> slot >> local >> remote >> state >> queues >> timer >> retransmits >> uid >>
            timeout >> inode;
        const int remote_port = std::stoi(remote.substr(remote.find(':') + 1), nullptr, 16);
        if (state == "01" && remote_port == port && sockets.count(inode) > 0) return true;
      }
    }
    return false;
  }

  std::unique_ptr<testing::LocalCluster> cluster_;
  std::unique_ptr<db::Connection> db_;
  int64_t term_ = 0;  // T, replica 1's
};

TEST_F(ApiFailoverE2eTest, AKilledStandbysAgentsAndClientsMoveOnToTheLeader) {
  ASSERT_NO_FATAL_FAILURE(StartWithAgentsOnTheStandby(/*checkpoint_service=*/false));
  auto replica1 = v1::NodeService::NewStub(
      grpc::CreateChannel(cluster_->api_address(1), grpc::InsecureChannelCredentials()));

  // Long enough to be running through the failover (hundreds of steps a second unloaded).
  const v1::Job job = cluster_->Submit(testing::SyntheticTrainingSpec(/*max_steps=*/4000));
  const v1::Job running = cluster_->AwaitJob(
      job.name(), [](const v1::Job& j) { return Ended(j) || j.state() == v1::Job::RUNNING; },
      seconds(30));
  ASSERT_EQ(running.state(), v1::Job::RUNNING) << cluster_->Describe(job.name());
  ASSERT_NO_FATAL_FAILURE(ExpectReplica1LeadsInTermT());

  const google::protobuf::Timestamp killed = google::protobuf::util::TimeUtil::GetCurrentTime();
  cluster_->KillApiReplica(0, SIGKILL);
  const auto cli_start = Clock::now();
  const testing::RunResult got =
      testing::Run({testing::BinaryPath("gradhub"), "--server", cluster_->api_addresses(),
                    "--token", cluster_->tenant_token(), "get", job.name()});
  const double cli_seconds = std::chrono::duration<double>(Clock::now() - cli_start).count();
  std::cout << "[ measured ] replica 0 SIGKILLed, then `gradhub get` given both addresses: "
            << cli_seconds << " s" << std::endl;
  EXPECT_EQ(got.exit_code, 0) << got.err;
  EXPECT_NE(got.out.find(job.name()), std::string::npos) << got.out;
  EXPECT_LT(cli_seconds, 2.0);
  for (const char* agent : {"a", "b"}) {
    const double seconds = SecondsToNextHeartbeat(*cluster_, *replica1, agent, killed);
    std::cout << "[ measured ] replica 0 SIGKILLed to agent " << agent
              << "'s next heartbeat recorded (via replica 1): " << seconds << " s" << std::endl;
    EXPECT_GE(seconds, 0) << "no heartbeat within 10 s\n" << cluster_->AgentStderr(agent);
    EXPECT_LT(seconds, 2.0) << cluster_->AgentStderr(agent);
  }

  // Read through replica 1 from here on (replica 0 is gone): jobs() fails over too.
  const v1::Job finished = cluster_->AwaitJob(job.name(), Ended, seconds(60));
  EXPECT_EQ(finished.state(), v1::Job::SUCCEEDED) << finished.DebugString();
  EXPECT_EQ(finished.attempt(), running.attempt()) << "restarted: " << finished.DebugString();
  ExpectReplica1LeadsInTermT();
}

TEST_F(ApiFailoverE2eTest, RanksInRendezvousOnAKilledStandbyStillStart) {
  // The job's last checkpoint goes to the checkpoint service.
  ASSERT_NO_FATAL_FAILURE(StartWithAgentsOnTheStandby(/*checkpoint_service=*/true));
  // Agent b paused: the job is placed on both nodes (b's heartbeat is still fresh), but only
  // a's two ranks start, and they wait in rendezvous for b's (on replica 0, the first address).
  ASSERT_EQ(kill(cluster_->AgentPid("b"), SIGSTOP), 0);
  const v1::Job job = cluster_->Submit(testing::SyntheticTrainingSpec(/*max_steps=*/300));
  for (const auto limit = Clock::now() + seconds(30);
       cluster_->TrainersOf("a").size() < 2 && Clock::now() < limit;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_EQ(cluster_->TrainersOf("a").size(), 2u) << cluster_->Describe(job.name());
  // In rendezvous once their store clients are connected (to replica 0; a loaded machine may
  // take seconds to get them there), their waits parked a moment later.
  const auto on_replica0 = [&] {
    for (pid_t trainer : cluster_->TrainersOf("a")) {
      if (!ConnectedToReplica(trainer, 0)) return false;
    }
    return true;
  };
  for (const auto limit = Clock::now() + seconds(20); !on_replica0() && Clock::now() < limit;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(on_replica0()) << "a's ranks are not in rendezvous on replica 0";
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  ASSERT_NO_FATAL_FAILURE(ExpectReplica1LeadsInTermT());
  cluster_->KillApiReplica(0, SIGKILL);
  std::this_thread::sleep_for(seconds(1));
  ASSERT_EQ(kill(cluster_->AgentPid("b"), SIGCONT), 0);

  const v1::Job finished = cluster_->AwaitJob(job.name(), Ended, seconds(60));
  EXPECT_EQ(finished.state(), v1::Job::SUCCEEDED) << finished.DebugString();
  EXPECT_EQ(finished.attempt(), 1) << "the rendezvous did not survive: " << finished.DebugString();
  ExpectReplica1LeadsInTermT();
}

}  // namespace
}  // namespace gradhub
