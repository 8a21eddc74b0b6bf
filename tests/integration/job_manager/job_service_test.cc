// JobService over real gRPC channels on loopback, backed by a real PostgreSQL: the calls a
// client makes, with tokens in the `authorization` metadata.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <limits>

#include "services/api/job_service.h"
#include "services/common/job_records.h"
#include "tests/integration/db/db_test_util.h"
#include "tests/support/grpc_test_server.h"
#include "tests/support/job_specs.h"

namespace gradhub::api {
namespace {

using ::testing::HasSubstr;

class JobServiceTest : public db::DatabaseTest {
 protected:
  void SetUp() override {
    db::DatabaseTest::SetUp();
    Migrate();
    pool_ = MakePool(4);
    auth_ = std::make_unique<Authenticator>(pool_.get(), "admin-secret");
    jobs_ = std::make_unique<JobManager>(pool_.get(), SpecLimits{});
    service_ = std::make_unique<JobService>(jobs_.get(), auth_.get(), /*auditor=*/nullptr);
    server_ =
        std::make_unique<testing::TestGrpcServer>(std::vector<grpc::Service*>{service_.get()});
    stub_ = v1::JobService::NewStub(server_->NewChannel());
    for (const char* name : {"team-a", "team-b"}) ASSERT_TRUE(auth_->CreateTenant(name, "").ok());
    token_a_ = auth_->CreateTenantToken("team-a", "")->secret;
    token_b_ = auth_->CreateTenantToken("team-b", "")->secret;
  }
  void TearDown() override { server_.reset(); }

  std::unique_ptr<grpc::ClientContext> As(const std::string& token) {
    auto context = std::make_unique<grpc::ClientContext>();
    if (!token.empty()) context->AddMetadata("authorization", "Bearer " + token);
    return context;
  }

  static v1::CreateJobRequest Create(const std::string& request_id) {
    v1::CreateJobRequest request;
    *request.mutable_spec() = testing::MinimalJobSpec();
    request.set_request_id(request_id);
    return request;
  }

  std::unique_ptr<db::Pool> pool_;
  std::unique_ptr<Authenticator> auth_;
  std::unique_ptr<JobManager> jobs_;
  std::unique_ptr<JobService> service_;
  std::unique_ptr<testing::TestGrpcServer> server_;
  std::unique_ptr<v1::JobService::Stub> stub_;
  std::string token_a_, token_b_;
};

TEST_F(JobServiceTest, CreateGetListCancelEvents) {
  v1::Job job;
  ASSERT_TRUE(stub_->CreateJob(As(token_a_).get(), Create("r1"), &job).ok());
  v1::Job retried;
  ASSERT_TRUE(stub_->CreateJob(As(token_a_).get(), Create("r1"), &retried).ok());
  EXPECT_EQ(retried.name(), job.name());
  for (int i = 0; i < 4; ++i) {
    v1::Job more;
    ASSERT_TRUE(stub_->CreateJob(As(token_a_).get(), Create(""), &more).ok());
  }

  v1::GetJobRequest get;
  get.set_name(job.name());
  v1::Job got;
  ASSERT_TRUE(stub_->GetJob(As(token_a_).get(), get, &got).ok());
  EXPECT_EQ(got.state(), v1::Job::PENDING);

  v1::ListJobsRequest list;
  list.set_page_size(2);
  int seen = 0;
  do {
    v1::ListJobsResponse page;
    ASSERT_TRUE(stub_->ListJobs(As(token_a_).get(), list, &page).ok());
    seen += page.jobs_size();
    list.set_page_token(page.next_page_token());
  } while (!list.page_token().empty());
  EXPECT_EQ(seen, 5);

  v1::CancelJobRequest cancel;
  cancel.set_name(job.name());
  cancel.set_reason("superseded by a bigger run");
  v1::Job cancelled;
  ASSERT_TRUE(stub_->CancelJob(As(token_a_).get(), cancel, &cancelled).ok());
  EXPECT_EQ(cancelled.state(), v1::Job::CANCELLED);
  EXPECT_THAT(cancelled.state_reason(), HasSubstr("superseded by a bigger run"));
  ASSERT_TRUE(stub_->CancelJob(As(token_a_).get(), cancel, &cancelled).ok()) << "idempotent";

  v1::ListJobEventsRequest events;
  events.set_parent(job.name());
  v1::ListJobEventsResponse history;
  ASSERT_TRUE(stub_->ListJobEvents(As(token_a_).get(), events, &history).ok());
  ASSERT_EQ(history.events_size(), 3);  // submitted, cancel requested, cancelled
  EXPECT_EQ(history.events(1).type(), v1::JobEvent::CANCEL_REQUESTED);
  EXPECT_EQ(history.events(1).message(), "superseded by a bigger run");
  EXPECT_EQ(history.events(2).to_state(), v1::Job::CANCELLED);
}

TEST_F(JobServiceTest, TokensAndTenantsAreEnforced) {
  v1::Job job;
  EXPECT_EQ(stub_->CreateJob(As("").get(), Create(""), &job).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(stub_->CreateJob(As("ghk_wrong").get(), Create(""), &job).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  const std::string node = auth_->CreateNodeToken("")->secret;
  EXPECT_EQ(stub_->CreateJob(As(node).get(), Create(""), &job).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);

  ASSERT_TRUE(stub_->CreateJob(As(token_a_).get(), Create(""), &job).ok());
  v1::GetJobRequest get;
  get.set_name(job.name());
  v1::Job got;
  EXPECT_EQ(stub_->GetJob(As(token_b_).get(), get, &got).error_code(), grpc::StatusCode::NOT_FOUND);
  v1::CancelJobRequest cancel;
  cancel.set_name(job.name());
  EXPECT_EQ(stub_->CancelJob(As(token_b_).get(), cancel, &got).error_code(),
            grpc::StatusCode::NOT_FOUND);
  v1::ListJobsResponse page;
  ASSERT_TRUE(stub_->ListJobs(As(token_b_).get(), v1::ListJobsRequest(), &page).ok());
  EXPECT_EQ(page.jobs_size(), 0);
}

TEST_F(JobServiceTest, InvalidSpecIsInvalidArgumentNamingTheField) {
  v1::CreateJobRequest request = Create("");
  request.mutable_spec()->mutable_distributed()->set_world_size(100000);
  v1::Job job;
  grpc::Status status = stub_->CreateJob(As(token_a_).get(), request, &job);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("distributed.worldSize"));
}

// The values the REST gateway's JSON parser refuses arrive over gRPC as binary protos: the
// same validators refuse them, by the same names.
TEST_F(JobServiceTest, ValuesNoSpecCanMeanAndNulRequestIdsAreRefusedOverGrpcToo) {
  v1::CreateJobRequest request = Create("r1");
  v1::Job job;
  ASSERT_TRUE(stub_->CreateJob(As(token_a_).get(), request, &job).ok());
  request.mutable_spec()->set_precision(static_cast<v1::JobSpec::Precision>(9));
  request.mutable_spec()->mutable_optimizer()->mutable_sgd()->set_lr(
      std::numeric_limits<double>::infinity());
  request.mutable_spec()->set_display_name(std::string("a\0b", 3));
  grpc::Status status = stub_->CreateJob(As(token_a_).get(), request, &job);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  for (const char* field : {"precision", "optimizer.sgd.lr", "displayName"}) {
    EXPECT_THAT(status.error_message(), HasSubstr(field));
  }
  request = Create(std::string("r1\0x", 4));
  status = stub_->CreateJob(As(token_a_).get(), request, &job);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("request_id: holds a NUL character"));
}

TEST_F(JobServiceTest, AdminTokenReadsEveryTenantsJobsButCreatesNone) {
  v1::Job job;
  ASSERT_TRUE(stub_->CreateJob(As(token_a_).get(), Create(""), &job).ok());
  v1::GetJobRequest get;
  get.set_name(job.name());
  v1::Job seen;
  ASSERT_TRUE(stub_->GetJob(As("admin-secret").get(), get, &seen).ok());
  EXPECT_EQ(seen.name(), job.name());
  v1::ListJobsResponse listed;
  ASSERT_TRUE(stub_->ListJobs(As("admin-secret").get(), v1::ListJobsRequest(), &listed).ok());
  EXPECT_GE(listed.jobs_size(), 1);
  EXPECT_EQ(stub_->CreateJob(As("admin-secret").get(), Create(""), &job).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
}

TEST_F(JobServiceTest, GetJobMetricsChecksTokensTenantsAndMaxPoints) {
  v1::Job job;
  ASSERT_TRUE(stub_->CreateJob(As(token_a_).get(), Create(""), &job).ok());
  ASSERT_TRUE(pool_
                  ->Exec("INSERT INTO job_metric_points"
                         " (job_id, step, attempt, loss, eval_metrics)"
                         " VALUES ($1::uuid, 10, 1, 2.5, NULL),"
                         " ($1::uuid, 20, 1, 1.5, '{\"accuracy\": 0.5}')",
                         {JobId(job.name())})
                  .ok());
  v1::GetJobMetricsRequest request;
  request.set_name(job.name());
  v1::JobMetrics metrics;
  ASSERT_TRUE(stub_->GetJobMetrics(As(token_a_).get(), request, &metrics).ok());
  EXPECT_EQ(metrics.name(), job.name());
  EXPECT_EQ(metrics.recorded_points(), 2);
  ASSERT_EQ(metrics.points_size(), 2);
  EXPECT_DOUBLE_EQ(metrics.points(0).loss(), 2.5);
  EXPECT_DOUBLE_EQ(metrics.points(1).eval_metrics().at("accuracy"), 0.5);
  ASSERT_TRUE(stub_->GetJobMetrics(As("admin-secret").get(), request, &metrics).ok());

  EXPECT_EQ(stub_->GetJobMetrics(As(token_b_).get(), request, &metrics).error_code(),
            grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(stub_->GetJobMetrics(As("").get(), request, &metrics).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  request.set_max_points(-5);
  const grpc::Status invalid = stub_->GetJobMetrics(As(token_a_).get(), request, &metrics);
  EXPECT_EQ(invalid.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(invalid.error_message(), HasSubstr("max_points"));
}

}  // namespace
}  // namespace gradhub::api
