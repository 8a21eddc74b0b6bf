// The agent's IssueRankCredential call (rank_preparer.h) against a real gRPC server on
// loopback: tried again while the api cannot be reached (UNAVAILABLE), within its patience and
// until the agent stops; any other answer ends it at once.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <thread>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gpu_worker/agent/rank_preparer.h"
#include "gradhub/v1/nodes.grpc.pb.h"

namespace gradhub::agent {
namespace {

// Answers IssueRankCredential with `failure` the first `failures` calls, then a token.
class CredentialServer final : public v1::NodeService::Service {
 public:
  CredentialServer(int failures, grpc::StatusCode failure)
      : failures_(failures), failure_(failure) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(this);
    server_ = builder.BuildAndStart();
    stub_ = v1::NodeService::NewStub(grpc::CreateChannel("127.0.0.1:" + std::to_string(port_),
                                                         grpc::InsecureChannelCredentials()));
  }
  ~CredentialServer() override { server_->Shutdown(); }

  grpc::Status IssueRankCredential(grpc::ServerContext*, const v1::IssueRankCredentialRequest*,
                                   v1::IssueRankCredentialResponse* response) override {
    if (calls_.fetch_add(1) < failures_) return grpc::Status(failure_, "not now");
    response->set_token("ghj_issued");
    return grpc::Status::OK;
  }

  v1::NodeService::Stub& stub() { return *stub_; }
  int calls() const { return calls_.load(); }

 private:
  const int failures_;
  const grpc::StatusCode failure_;
  std::atomic<int> calls_{0};
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::NodeService::Stub> stub_;
};

v1::IssueRankCredentialRequest Request() {
  v1::IssueRankCredentialRequest request;
  request.set_node("nodes/a");
  request.set_job("jobs/x");
  return request;
}

TEST(RankCredentialTest, AnUnreachableApiIsAskedAgainUntilItAnswers) {
  CredentialServer server(2, grpc::StatusCode::UNAVAILABLE);
  absl::Notification stopping;
  const absl::StatusOr<std::string> token = IssueRankCredential(
      server.stub(), Request(), "ghn_node", absl::Seconds(5), absl::Seconds(30), stopping);
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ(*token, "ghj_issued");
  EXPECT_EQ(server.calls(), 3);
}

TEST(RankCredentialTest, AnyOtherAnswerEndsItAtOnce) {
  CredentialServer server(1, grpc::StatusCode::NOT_FOUND);
  absl::Notification stopping;
  const absl::StatusOr<std::string> token = IssueRankCredential(
      server.stub(), Request(), "ghn_node", absl::Seconds(5), absl::Seconds(30), stopping);
  ASSERT_FALSE(token.ok());
  EXPECT_EQ(token.status().code(), absl::StatusCode::kUnavailable);  // the node's failure
  EXPECT_NE(token.status().message().find("NOT_FOUND"), std::string::npos) << token.status();
  EXPECT_EQ(server.calls(), 1);
}

TEST(RankCredentialTest, PatienceBoundsTheTries) {
  CredentialServer server(1 << 20, grpc::StatusCode::UNAVAILABLE);
  absl::Notification stopping;
  const absl::Time start = absl::Now();
  const absl::StatusOr<std::string> token = IssueRankCredential(
      server.stub(), Request(), "ghn_node", absl::Seconds(5), absl::Milliseconds(500), stopping);
  const absl::Duration took = absl::Now() - start;
  ASSERT_FALSE(token.ok());
  EXPECT_NE(token.status().message().find("UNAVAILABLE"), std::string::npos) << token.status();
  EXPECT_GE(server.calls(), 3);  // 0, 100 and 300 ms
  EXPECT_LT(took, absl::Seconds(2));
}

TEST(RankCredentialTest, AStoppingAgentGivesUpAtOnce) {
  CredentialServer server(1 << 20, grpc::StatusCode::UNAVAILABLE);
  absl::Notification stopping;
  std::thread stopper([&] {
    absl::SleepFor(absl::Milliseconds(300));
    stopping.Notify();
  });
  const absl::Time start = absl::Now();
  const absl::StatusOr<std::string> token = IssueRankCredential(
      server.stub(), Request(), "ghn_node", absl::Seconds(5), absl::Seconds(60), stopping);
  stopper.join();
  EXPECT_FALSE(token.ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
}

}  // namespace
}  // namespace gradhub::agent
