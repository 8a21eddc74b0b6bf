// Issue 34, fault 4: gradhub-api cut off from PostgreSQL while a job runs, on the whole local
// cluster as real processes. The database's packets are dropped (nftables), not refused: a
// partition, where nothing ever answers. The api must say so at once (readiness not ready,
// calls UNAVAILABLE) instead of hanging, recover by itself when the link returns, lose no
// create it acknowledged, and not restart the running job for the outage.
//
// The test binary's PostgreSQL listens on loopback in this namespace, and only gradhub-api
// uses it here (no checkpoint or metrics service: the agents keep checkpoints in the cluster's
// directory), so dropping its port cuts off the api alone.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "gradhub/v1/jobs.grpc.pb.h"
#include "tests/support/job_specs.h"
#include "tests/support/local_cluster.h"
#include "tests/support/packet_filter.h"
#include "tests/support/postgres_server.h"

namespace gradhub {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::seconds;
using testing::Ended;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

class DatabasePartitionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (testing::PostgresServer::Shared().external()) {
      GTEST_SKIP() << "drops the port of the test's own PostgreSQL; an external one is elsewhere";
    }
    if (!testing::PacketFilter::Available(&why)) GTEST_SKIP() << why;
    cluster_ = std::make_unique<testing::LocalCluster>();
    ASSERT_TRUE(cluster_->Start());
  }

  // GET /readyz: its HTTP status (0 = no answer) and how long the answer took.
  std::pair<int, double> Readiness() {
    httplib::Client http("127.0.0.1", cluster_->api_http_port());
    http.set_read_timeout(10, 0);
    const auto start = Clock::now();
    const httplib::Result answer = http.Get("/readyz");
    return {answer ? answer->status : 0, SecondsSince(start)};
  }

  // Polls /readyz until it answers `want` (or `limit` passes); returns when it first did,
  // seconds after `since`. Fails when an answer itself took over a second: a readiness probe
  // that waits longer than its period is no answer at all.
  double AwaitReadiness(int want, Clock::time_point since, double limit) {
    while (SecondsSince(since) < limit) {
      const auto [status, took] = Readiness();
      EXPECT_LT(took, 1.0) << "/readyz took " << took << " s to answer " << status;
      if (status == want) return SecondsSince(since);
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ADD_FAILURE() << "/readyz never answered " << want << " within " << limit << " s";
    return limit;
  }

  // CreateJob with a request id; the status, and how long it took.
  std::pair<grpc::Status, double> Create(const v1::JobSpec& spec, const std::string& request_id,
                                         v1::Job* job) {
    v1::CreateJobRequest request;
    *request.mutable_spec() = spec;
    request.set_request_id(request_id);
    const auto start = Clock::now();
    const grpc::Status status =
        cluster_->jobs().CreateJob(cluster_->TenantContext().get(), request, job);
    return {status, SecondsSince(start)};
  }

  std::vector<pid_t> AllTrainers() {
    std::vector<pid_t> pids = cluster_->TrainersOf("a");
    for (pid_t pid : cluster_->TrainersOf("b")) pids.push_back(pid);
    std::sort(pids.begin(), pids.end());
    return pids;
  }

  int CountEvents(const std::string& name, v1::JobEvent::Type type) {
    int n = 0;
    for (const auto& e : cluster_->Events(name)) n += e.type() == type;
    return n;
  }

  std::unique_ptr<testing::LocalCluster> cluster_;
};

// A job that waits aside for a node no one has: acknowledged and kept, never run.
v1::JobSpec Waiting() {
  v1::JobSpec spec = testing::SyntheticTrainingSpec(10);
  (*spec.mutable_node_selector())["pool"] = "none";
  return spec;
}

TEST_F(DatabasePartitionTest, TheApiSaysSoAtOnceRecoversByItselfAndRestartsNothing) {
  // Long enough to run through the outage and its aftermath (16-37 s unloaded).
  const std::string name = cluster_->Submit(testing::SyntheticTrainingSpec(15000)).name();
  std::vector<std::string> acknowledged = {name};
  v1::Job waiting;
  ASSERT_TRUE(Create(Waiting(), "before", &waiting).first.ok());
  acknowledged.push_back(waiting.name());
  const v1::Job running = cluster_->AwaitJob(name, [](const v1::Job& j) {
    return Ended(j) || (j.state() == v1::Job::RUNNING && j.progress().step() >= 20);
  });
  ASSERT_EQ(running.state(), v1::Job::RUNNING) << cluster_->Describe(name);
  const std::vector<pid_t> trainers = AllTrainers();
  ASSERT_EQ(trainers.size(), 4u);
  ASSERT_EQ(Readiness().first, 200);

  // 1. The cut: readiness says so within a second, CreateJob answers UNAVAILABLE.
  testing::PacketFilter filter;
  filter.DropTcpPort(testing::PostgresServer::Shared().port());
  const auto cut = Clock::now();
  const double not_ready = AwaitReadiness(503, cut, 5);
  v1::Job none;
  const auto [first, first_took] = Create(Waiting(), "during-1", &none);
  const auto [second, second_took] = Create(Waiting(), "during-2", &none);
  std::cout << "[ measured ] /readyz not ready " << not_ready << " s after the cut; CreateJob "
            << first.error_code() << " after " << first_took << " s, then " << second.error_code()
            << " after " << second_took << " s" << std::endl;
  EXPECT_LT(not_ready, 1.5);
  for (const grpc::Status& status : {first, second}) {
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
    EXPECT_NE(status.error_message().find("database"), std::string::npos) << status.error_message();
  }
  EXPECT_LT(first_took, 4.0) << "a hang, not an answer (the silence timeout is 2 s)";
  EXPECT_LT(second_took, 0.5) << "known unreachable: it should fail at once";

  // 2. Two leases and more of outage (3 s each here): a node's last recorded heartbeat is
  //    older than its lease when the database returns.
  std::this_thread::sleep_for(seconds(7) - (Clock::now() - cut));
  filter.LiftAll();
  const auto lifted = Clock::now();
  const double ready = AwaitReadiness(200, lifted, 15);
  std::cout << "[ measured ] outage " << std::chrono::duration<double>(lifted - cut).count()
            << " s; ready again " << ready << " s after the link returned" << std::endl;
  EXPECT_LT(ready, 5.0);

  // 3. Acknowledged after the outage too.
  v1::Job after;
  const auto [created, created_took] = Create(Waiting(), "after", &after);
  ASSERT_TRUE(created.ok()) << created.error_message();
  acknowledged.push_back(after.name());

  // 4. The job was not restarted for the outage: the same ranks, one attempt, no node lost,
  //    also past the grace the sweep gives the nodes after an outage (10 heartbeats).
  const int64_t before = running.progress().step();
  const v1::Job moving = cluster_->AwaitJob(
      name, [&](const v1::Job& j) { return Ended(j) || j.progress().step() > before; },
      seconds(30));
  std::cout << "[ measured ] step " << before << " before the cut, " << moving.progress().step()
            << " reported " << SecondsSince(lifted) << " s after the link returned" << std::endl;
  EXPECT_EQ(moving.attempt(), 1) << cluster_->Describe(name);
  if (!Ended(moving)) {
    EXPECT_EQ(AllTrainers(), trainers) << "the ranks were restarted";
  }
  const v1::Job done = cluster_->AwaitJob(name, Ended, seconds(180));
  ASSERT_EQ(done.state(), v1::Job::SUCCEEDED) << done.state_reason() << cluster_->Describe(name);
  EXPECT_EQ(done.attempt(), 1);
  EXPECT_EQ(done.infrastructure_restarts(), 0);
  EXPECT_EQ(CountEvents(name, v1::JobEvent::NODE_LOST), 0) << cluster_->Describe(name);
  EXPECT_EQ(cluster_->NodeState("a"), v1::Node::READY);
  EXPECT_EQ(cluster_->NodeState("b"), v1::Node::READY);

  // 5. Every acknowledged create is there; those refused during the outage are not.
  for (const std::string& job : acknowledged) {
    v1::GetJobRequest request;
    request.set_name(job);
    v1::Job found;
    EXPECT_TRUE(cluster_->jobs().GetJob(cluster_->TenantContext().get(), request, &found).ok())
        << job << " was acknowledged and is gone";
  }
  v1::ListJobsRequest list;
  list.set_page_size(100);
  v1::ListJobsResponse listed;
  ASSERT_TRUE(cluster_->jobs().ListJobs(cluster_->TenantContext().get(), list, &listed).ok());
  EXPECT_EQ(listed.jobs_size(), static_cast<int>(acknowledged.size()));
  for (const v1::Job& job : listed.jobs()) {
    EXPECT_NE(job.request_id().rfind("during", 0), 0u) << job.name() << " was refused";
  }
}

}  // namespace
}  // namespace gradhub
