// RankTable with real rank processes and a LogShipper that ships to a NodeService on loopback:
// what the heartbeat reports for started, stopped and unstartable ranks, what reconcile does
// with them, and that a dropped key is never started again.
#include "gpu_worker/agent/rank_table.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "services/common/contract/trainer_exit_codes.h"

namespace gradhub::agent {
namespace {

// Stores every line it is sent and acknowledges it.
class LogSink final : public v1::NodeService::Service {
 public:
  grpc::Status ReportLogs(grpc::ServerContext*, grpc::ServerReader<v1::ReportLogsRequest>* reader,
                          v1::ReportLogsResponse* response) override {
    v1::ReportLogsRequest request;
    while (reader->Read(&request)) {
      std::lock_guard<std::mutex> lock(mu_);
      for (int i = 0; i < request.lines_size(); ++i) lines_.push_back(request.lines(i));
      response->set_acked_seq(request.first_seq() + request.lines_size() - 1);
    }
    return grpc::Status::OK;
  }
  std::vector<std::string> lines() {
    std::lock_guard<std::mutex> lock(mu_);
    return lines_;
  }

 private:
  std::mutex mu_;
  std::vector<std::string> lines_;
};

v1::RankAssignment Assignment(const std::string& job, int attempt, int rank) {
  v1::RankAssignment assignment;
  assignment.set_job(job);
  assignment.set_attempt(attempt);
  assignment.set_rank(rank);
  return assignment;
}

google::protobuf::RepeatedPtrField<v1::RankAssignment> Desired(
    std::vector<v1::RankAssignment> assignments) {
  return {assignments.begin(), assignments.end()};
}

std::unique_ptr<RankProcess> Sleeper() {
  RankProcessOptions options;
  options.argv = {"/bin/sleep", "60"};
  auto process = RankProcess::Start(std::move(options));
  EXPECT_TRUE(process.ok()) << process.status();
  return process.ok() ? *std::move(process) : nullptr;
}

class RankTableTest : public ::testing::Test {
 protected:
  RankTableTest() {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&sink_);
    server_ = builder.BuildAndStart();
    stub_ = v1::NodeService::NewStub(grpc::CreateChannel("127.0.0.1:" + std::to_string(port),
                                                         grpc::InsecureChannelCredentials()));
    shipper_ = std::make_unique<LogShipper>(stub_.get(), LogShipperOptions{});
  }
  ~RankTableTest() override {
    shipper_.reset();
    server_->Shutdown();
  }

  std::vector<v1::RankStatus> Report(const RankTable& table) {
    google::protobuf::RepeatedPtrField<v1::RankStatus> statuses;
    table.Report(&statuses);
    return {statuses.begin(), statuses.end()};
  }

  LogSink sink_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::NodeService::Stub> stub_;
  std::unique_ptr<LogShipper> shipper_;
  const RankKey key_{"jobs/j", 1, 0};
};

TEST_F(RankTableTest, ARankThatCouldNotStartIsReportedAsFailedAndLoggedForItsOwner) {
  RankTable table(shipper_.get(), absl::Seconds(1));
  table.FailedToStart(key_, absl::InvalidArgumentError("no such data root"),
                      trainer::kExitUserError);
  const std::vector<v1::RankStatus> report = Report(table);
  ASSERT_EQ(report.size(), 1u);
  EXPECT_EQ(KeyOf(report[0]), key_);
  EXPECT_EQ(report[0].state(), v1::RankStatus::FAILED);
  EXPECT_EQ(report[0].exit_code(), trainer::kExitUserError);
  EXPECT_EQ(report[0].message(),
            "gradhub-agent: cannot start jobs/j attempt 1 rank 0: no such data root");
  ASSERT_TRUE(shipper_->Flush(absl::Seconds(10)));
  EXPECT_EQ(sink_.lines(), std::vector<std::string>{report[0].message()});
  // Still desired: kept and reported, never started again; no longer desired: dropped.
  ReconcileActions actions = table.Reconcile(Desired({Assignment("jobs/j", 1, 0)}));
  EXPECT_TRUE(actions.start.empty());
  EXPECT_TRUE(actions.drop.empty());
  actions = table.Reconcile(Desired({}));
  EXPECT_EQ(actions.drop, std::vector<RankKey>{key_});
  EXPECT_TRUE(actions.stop.empty());
}

TEST_F(RankTableTest, AStoppedRankSaysWhyAndADroppedKeyIsNeverStartedAgain) {
  RankTable table(shipper_.get(), absl::Seconds(1));
  table.Started(key_, Sleeper());
  EXPECT_TRUE(table.AnyRunning());
  EXPECT_EQ(table.CountExited(), 0u);
  ReconcileActions actions = table.Reconcile(Desired({}));
  ASSERT_EQ(actions.stop, std::vector<RankKey>{key_});

  table.Stop(key_, "no longer desired by the server");
  table.Stop(key_, "a later reason");  // the first reason stays
  EXPECT_FALSE(table.AnyRunning());    // asked to stop
  EXPECT_TRUE(table.Reconcile(Desired({})).stop.empty());
  table.WaitAllExited();
  EXPECT_EQ(table.CountExited(), 1u);
  const std::vector<v1::RankStatus> report = Report(table);
  ASSERT_EQ(report.size(), 1u);
  EXPECT_EQ(report[0].state(), v1::RankStatus::STOPPED);
  EXPECT_EQ(report[0].message(), "stopped by the agent: no longer desired by the server");

  actions = table.Reconcile(Desired({}));
  ASSERT_EQ(actions.drop, std::vector<RankKey>{key_});
  table.Drop(key_);
  EXPECT_TRUE(Report(table).empty());
  actions = table.Reconcile(Desired({Assignment("jobs/j", 1, 0), Assignment("jobs/j", 2, 0)}));
  ASSERT_EQ(actions.start.size(), 1u);  // only the new attempt's key
  EXPECT_EQ(actions.start[0].attempt(), 2);
}

TEST_F(RankTableTest, StopAllWaitAndDropAllForgetEveryRank) {
  RankTable table(shipper_.get(), absl::Seconds(1));
  table.Started(key_, Sleeper());
  table.Started({"jobs/j", 1, 1}, Sleeper());
  table.FailedToStart({"jobs/j", 1, 2}, absl::InternalError("no cgroup"),
                      trainer::kExitInfrastructure);
  table.StopAll("the agent is shutting down");
  table.WaitAllExited();
  EXPECT_EQ(table.CountExited(), 2u);  // the third never had a process
  for (const v1::RankStatus& status : Report(table)) {
    if (status.rank() == 2) continue;
    EXPECT_EQ(status.state(), v1::RankStatus::STOPPED);
    EXPECT_EQ(status.message(), "stopped by the agent: the agent is shutting down");
  }
  table.DropAll();
  EXPECT_TRUE(Report(table).empty());
  EXPECT_TRUE(table.Reconcile(Desired({Assignment("jobs/j", 1, 1)})).start.empty());
}

}  // namespace
}  // namespace gradhub::agent
