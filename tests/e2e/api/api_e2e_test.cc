// gradhub-api as a real process on a real PostgreSQL: bootstrap a tenant, create a job over
// gRPC, survive SIGKILL with every acknowledged job kept, and exit 0 on SIGTERM.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <regex>
#include <string>
#include <thread>

#include "gradhub/v1/jobs.grpc.pb.h"
#include "tests/support/job_specs.h"
#include "tests/support/postgres_server.h"
#include "tests/support/subprocess.h"

namespace gradhub {
namespace {

using testing::BinaryPath;
using testing::Subprocess;

// Starts `gradhub-api serve` on a free port and returns the port it printed.
int StartApi(std::unique_ptr<Subprocess>* api, const std::string& url) {
  *api = std::make_unique<Subprocess>(std::vector<std::string>{
      BinaryPath("gradhub-api"), "--database-url", url, "--grpc-address", "127.0.0.1:0",
      "--http-host", "127.0.0.1", "--http-port", "0", "--shutdown-grace", "2s", "serve"});
  static const std::regex kServing("serving gRPC on port ([0-9]+)");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < deadline && (*api)->running()) {
    std::smatch match;
    const std::string out = (*api)->out();
    if (std::regex_search(out, match, kServing)) return std::stoi(match[1].str());
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ADD_FAILURE() << "gradhub-api did not start:\n" << (*api)->err();
  return 0;
}

v1::CreateJobRequest DigitsJob(const std::string& request_id) {
  v1::CreateJobRequest request;
  *request.mutable_spec() = testing::MinimalJobSpec();
  request.set_request_id(request_id);
  return request;
}

TEST(ApiE2eTest, AcknowledgedJobsSurviveSigkillAndSigtermExitsCleanly) {
  const std::string url = testing::PostgresServer::Shared().CreateDatabase();
  std::unique_ptr<Subprocess> api;
  int port = StartApi(&api, url);
  ASSERT_GT(port, 0);

  testing::RunResult tenant =
      testing::Run({BinaryPath("gradhub-api"), "--database-url", url, "create-tenant", "team-a"});
  ASSERT_EQ(tenant.exit_code, 0) << tenant.err;
  const std::string token = tenant.out.substr(0, tenant.out.find('\n'));
  ASSERT_EQ(token.rfind("ghk_", 0), 0u) << tenant.out;

  auto stub = v1::JobService::NewStub(
      grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials()));
  std::vector<std::string> acknowledged;
  for (int i = 0; i < 20; ++i) {
    grpc::ClientContext context;
    context.AddMetadata("authorization", "Bearer " + token);
    v1::Job job;
    if (stub->CreateJob(&context, DigitsJob("r" + std::to_string(i)), &job).ok()) {
      acknowledged.push_back(job.name());
    }
  }
  ASSERT_EQ(acknowledged.size(), 20u);

  api->Kill(SIGKILL);
  api->Wait();
  port = StartApi(&api, url);
  ASSERT_GT(port, 0);
  stub = v1::JobService::NewStub(
      grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials()));
  for (const std::string& name : acknowledged) {
    grpc::ClientContext context;
    context.AddMetadata("authorization", "Bearer " + token);
    v1::GetJobRequest get;
    get.set_name(name);
    v1::Job job;
    EXPECT_TRUE(stub->GetJob(&context, get, &job).ok()) << name;
  }

  api->Kill(SIGTERM);
  EXPECT_EQ(api->Wait(std::chrono::seconds(15)), 0) << api->err();
}

}  // namespace
}  // namespace gradhub
