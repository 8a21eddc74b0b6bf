// Two gradhub-api replicas on one PostgreSQL (issue 35), as real processes: the agents stream
// WatchAssignments from replica 0, the tenant talks to replica 1. A change made on replica 1
// reaches the agents through PostgreSQL LISTEN/NOTIFY (services/api/replica_signals.h), not
// through their heartbeats: with a 20 s heartbeat interval, ranks that start or stop within
// 3 s of the call can only have been pushed.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <iostream>
#include <memory>
#include <string>
#include <thread>

#include "gradhub/v1/jobs.grpc.pb.h"
#include "tests/support/job_specs.h"
#include "tests/support/local_cluster.h"

namespace gradhub {
namespace {

using Clock = std::chrono::steady_clock;
using testing::Ended;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

TEST(ControlPlaneReplicasE2eTest, WorkSubmittedToOneReplicaReachesAgentsOnAnother) {
  testing::LocalClusterOptions options;
  options.api_replicas = 2;
  options.heartbeat_interval = "20s";
  testing::LocalCluster cluster(options);
  ASSERT_TRUE(cluster.Start());
  auto replica1 = v1::JobService::NewStub(
      grpc::CreateChannel(cluster.api_address(1), grpc::InsecureChannelCredentials()));

  const auto submitted = Clock::now();
  v1::CreateJobRequest create;
  // Long enough to be cancelled while it runs.
  *create.mutable_spec() = testing::SyntheticTrainingSpec(/*max_steps=*/10000000);
  v1::Job job;
  const grpc::Status created = replica1->CreateJob(cluster.TenantContext().get(), create, &job);
  ASSERT_TRUE(created.ok()) << created.error_message();
  const v1::Job running = cluster.AwaitJob(
      job.name(), [](const v1::Job& j) { return Ended(j) || j.state() == v1::Job::RUNNING; },
      std::chrono::seconds(30));
  const double to_running = SecondsSince(submitted);
  std::cout << "[ measured ] CreateJob on replica 1 to RUNNING on agents of replica 0: "
            << to_running << " s (heartbeat 20 s)" << std::endl;
  ASSERT_EQ(running.state(), v1::Job::RUNNING) << cluster.Describe(job.name());
  EXPECT_LT(to_running, 3.0) << "not pushed: " << cluster.Describe(job.name());

  const auto cancelled = Clock::now();
  v1::CancelJobRequest cancel;
  cancel.set_name(job.name());
  v1::Job answer;
  const grpc::Status status = replica1->CancelJob(cluster.TenantContext().get(), cancel, &answer);
  ASSERT_TRUE(status.ok()) << status.error_message();
  while ((!cluster.TrainersOf("a").empty() || !cluster.TrainersOf("b").empty()) &&
         SecondsSince(cancelled) < 30) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const double to_stopped = SecondsSince(cancelled);
  std::cout << "[ measured ] CancelJob on replica 1 to every rank gone on agents of replica 0: "
            << to_stopped << " s (heartbeat 20 s)" << std::endl;
  EXPECT_TRUE(cluster.TrainersOf("a").empty() && cluster.TrainersOf("b").empty());
  EXPECT_LT(to_stopped, 3.0) << "not pushed: " << cluster.Describe(job.name());
}

}  // namespace
}  // namespace gradhub
