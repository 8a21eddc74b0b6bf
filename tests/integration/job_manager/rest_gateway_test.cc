// The REST gateway over real HTTP on loopback, backed by a real PostgreSQL.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include <regex>

#include "services/api/rest_gateway.h"
#include "tests/integration/db/db_test_util.h"

namespace gradhub::api {
namespace {

using ::testing::HasSubstr;

constexpr char kSpec[] = R"({
  "displayName": "it's \"quoted\"; DROP TABLE jobs; --",
  "model": {"mlp": {"layers": [64, 10]}},
  "dataset": {"csv": {"path": "/data/digits.csv.gz"}},
  "optimizer": {"sgd": {"lr": 0.05}},
  "batchSizePerRank": 32,
  "maxSteps": 10
})";

class RestGatewayTest : public db::DatabaseTest {
 protected:
  void SetUp() override {
    db::DatabaseTest::SetUp();
    Migrate();
    pool_ = MakePool(4);
    auth_ = std::make_unique<Authenticator>(pool_.get(), "");
    jobs_ = std::make_unique<JobManager>(pool_.get(), SpecLimits{});
    gateway_ = std::make_unique<RestGateway>(jobs_.get(), auth_.get(),
                                             RestGatewayOptions{.max_body_bytes = 64 * 1024});
    const int port = gateway_->Start("127.0.0.1", 0);
    ASSERT_GT(port, 0);
    client_ = std::make_unique<httplib::Client>("127.0.0.1", port);
    for (const char* name : {"team-a", "team-b"}) ASSERT_TRUE(auth_->CreateTenant(name, "").ok());
    headers_a_ = {{"Authorization", "Bearer " + auth_->CreateTenantToken("team-a", "")->secret}};
    headers_b_ = {{"Authorization", "Bearer " + auth_->CreateTenantToken("team-b", "")->secret}};
  }
  void TearDown() override { gateway_.reset(); }

  static std::string NameIn(const std::string& body) {
    std::smatch match;
    static const std::regex kName(R"re("name":\s*"(jobs/[^"]+)")re");
    const bool found = std::regex_search(body, match, kName);
    EXPECT_TRUE(found) << body;
    return match[1].str();
  }

  std::unique_ptr<db::Pool> pool_;
  std::unique_ptr<Authenticator> auth_;
  std::unique_ptr<JobManager> jobs_;
  std::unique_ptr<RestGateway> gateway_;
  std::unique_ptr<httplib::Client> client_;
  httplib::Headers headers_a_, headers_b_;
};

TEST_F(RestGatewayTest, CreateGetListCancelEvents) {
  auto created = client_->Post("/v1/jobs?requestId=r1", headers_a_, kSpec, "application/json");
  ASSERT_TRUE(created);
  ASSERT_EQ(created->status, 200) << created->body;
  const std::string name = NameIn(created->body);
  auto retried = client_->Post("/v1/jobs?requestId=r1", headers_a_, kSpec, "application/json");
  ASSERT_EQ(retried->status, 200);
  EXPECT_EQ(NameIn(retried->body), name);

  auto got = client_->Get(("/v1/" + name).c_str(), headers_a_);
  ASSERT_EQ(got->status, 200) << got->body;
  EXPECT_THAT(got->body, HasSubstr(R"(it's \"quoted\"; DROP TABLE jobs; --)"));
  EXPECT_THAT(got->body, HasSubstr("PENDING"));

  auto list = client_->Get("/v1/jobs?pageSize=10&filter=state%3DPENDING", headers_a_);
  ASSERT_EQ(list->status, 200) << list->body;
  EXPECT_THAT(list->body, HasSubstr(name));

  auto cancelled = client_->Post(("/v1/" + name + ":cancel").c_str(), headers_a_, "{}",
                                 "application/json");
  ASSERT_EQ(cancelled->status, 200) << cancelled->body;
  EXPECT_THAT(cancelled->body, HasSubstr("CANCELLED"));
  auto events = client_->Get(("/v1/" + name + "/events").c_str(), headers_a_);
  ASSERT_EQ(events->status, 200) << events->body;
  EXPECT_THAT(events->body, HasSubstr("CANCELLED"));
}

TEST_F(RestGatewayTest, HealthAndReadiness) {
  EXPECT_EQ(client_->Get("/healthz")->status, 200);
  EXPECT_EQ(client_->Get("/readyz")->status, 200);
  ASSERT_TRUE(pool_->Exec("DELETE FROM schema_migrations").ok());
  auto not_ready = client_->Get("/readyz");
  EXPECT_EQ(not_ready->status, 503);
  EXPECT_THAT(not_ready->body, HasSubstr("no migrations"));
}

TEST_F(RestGatewayTest, ErrorsHaveTheRightStatus) {
  auto no_token = client_->Post("/v1/jobs", kSpec, "application/json");
  EXPECT_EQ(no_token->status, 401);
  auto malformed = client_->Post("/v1/jobs", headers_a_, "{\"model\": ", "application/json");
  EXPECT_EQ(malformed->status, 400);
  EXPECT_THAT(malformed->body, HasSubstr("request body"));
  auto unknown_field = client_->Post("/v1/jobs", headers_a_, R"({"modle": {}})", "application/json");
  EXPECT_EQ(unknown_field->status, 400);
  EXPECT_THAT(unknown_field->body, HasSubstr("modle"));
  auto invalid = client_->Post("/v1/jobs", headers_a_, R"({"distributed": {"worldSize": -1}})",
                               "application/json");
  EXPECT_EQ(invalid->status, 400);
  EXPECT_THAT(invalid->body, HasSubstr("distributed.worldSize"));
  const std::string huge(100 * 1024, ' ');
  auto oversized = client_->Post("/v1/jobs", headers_a_, huge, "application/json");
  EXPECT_EQ(oversized->status, 413);

  auto created = client_->Post("/v1/jobs", headers_a_, kSpec, "application/json");
  ASSERT_EQ(created->status, 200);
  auto other_tenant = client_->Get(("/v1/" + NameIn(created->body)).c_str(), headers_b_);
  EXPECT_EQ(other_tenant->status, 404);
  auto bad_page = client_->Get("/v1/jobs?pageSize=ten", headers_a_);
  EXPECT_EQ(bad_page->status, 400);
}

}  // namespace
}  // namespace gradhub::api
