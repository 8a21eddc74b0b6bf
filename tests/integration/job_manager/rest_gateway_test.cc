// The REST gateway over real HTTP on loopback, backed by a real PostgreSQL.
#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <regex>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "services/api/rest_gateway.h"
#include "services/common/page_token.h"
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

constexpr char kAdminToken[] = "admin-secret-for-tests";

// The lines of a newline-delimited JSON body, blank (keep-alive) lines dropped.
std::vector<std::string> Lines(const std::string& body) {
  std::vector<std::string> lines;
  std::stringstream in(body);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) lines.push_back(line);
  }
  return lines;
}

class RestGatewayTest : public db::DatabaseTest {
 protected:
  void SetUp() override {
    db::DatabaseTest::SetUp();
    Migrate();
    pool_ = MakePool(4);
    auth_ = std::make_unique<Authenticator>(pool_.get(), kAdminToken);
    jobs_ = std::make_unique<JobManager>(pool_.get(), SpecLimits{});
    nodes_ = std::make_unique<NodeManager>(pool_.get(), NodeManagerOptions{});
    tenants_ = std::make_unique<TenantManager>(auth_.get());
    metrics_ = std::make_unique<ApiMetrics>(pool_.get());
    RestGatewayOptions options;
    options.max_body_bytes = 64 * 1024;
    gateway_ = std::make_unique<RestGateway>(Backends(), options);
    const absl::StatusOr<int> port = gateway_->Start("127.0.0.1", 0);
    ASSERT_TRUE(port.ok()) << port.status();
    client_ = std::make_unique<httplib::Client>("127.0.0.1", *port);
    port_ = *port;
    for (const char* name : {"team-a", "team-b"}) ASSERT_TRUE(auth_->CreateTenant(name, "").ok());
    headers_a_ = {{"Authorization", "Bearer " + auth_->CreateTenantToken("team-a", "")->secret}};
    headers_b_ = {{"Authorization", "Bearer " + auth_->CreateTenantToken("team-b", "")->secret}};
  }
  void TearDown() override { gateway_.reset(); }

  RestBackends Backends() {
    return RestBackends{.jobs = jobs_.get(),
                        .nodes = nodes_.get(),
                        .tenants = tenants_.get(),
                        .auth = auth_.get(),
                        .metrics = metrics_.get(),
                        .on_nodes_changed = [this] { ++nodes_changed_; }};
  }

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
  std::unique_ptr<NodeManager> nodes_;
  std::unique_ptr<TenantManager> tenants_;
  std::unique_ptr<ApiMetrics> metrics_;
  std::atomic<int> nodes_changed_{0};
  std::unique_ptr<RestGateway> gateway_;
  std::unique_ptr<httplib::Client> client_;
  int port_ = 0;
  httplib::Headers headers_a_, headers_b_;
  const httplib::Headers admin_ = {{"Authorization", std::string("Bearer ") + kAdminToken}};

  std::string Create() {
    auto created = client_->Post("/v1/jobs", headers_a_, kSpec, "application/json");
    EXPECT_EQ(created->status, 200) << created->body;
    return NameIn(created->body);
  }
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

  auto cancelled =
      client_->Post(("/v1/" + name + ":cancel").c_str(), headers_a_, "{}", "application/json");
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

// What `curl -X POST URL` sends: no body, and neither Content-Length nor Transfer-Encoding.
// The whole answer, read until the server closes (Connection: close).
std::string RawPost(int port, const std::string& path, const std::string& authorization) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address = {};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    close(fd);
    return "";
  }
  const std::string request = "POST " + path +
                              " HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: " + authorization +
                              "\r\nConnection: close\r\n\r\n";
  if (write(fd, request.data(), request.size()) != static_cast<ssize_t>(request.size())) {
    close(fd);
    return "";
  }
  std::string answer;
  char buffer[4096];
  for (ssize_t n; (n = read(fd, buffer, sizeof buffer)) > 0;) answer.append(buffer, n);
  close(fd);
  return answer;
}

TEST_F(RestGatewayTest, CancelWithoutABodyIsCancelWithAnEmptyOne) {
  auto created = client_->Post("/v1/jobs", headers_a_, kSpec, "application/json");
  ASSERT_EQ(created->status, 200) << created->body;
  const std::string name = NameIn(created->body);
  const auto start = std::chrono::steady_clock::now();
  const std::string answer =
      RawPost(port_, "/v1/" + name + ":cancel", headers_a_.find("Authorization")->second);
  EXPECT_THAT(answer, ::testing::StartsWith("HTTP/1.1 200")) << answer;
  EXPECT_THAT(answer, HasSubstr("CANCELLED"));
  // At once, not after the server's read timeout.
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
}

TEST_F(RestGatewayTest, AnOversizedBodyIs413WithCode413) {
  const std::string huge(100 * 1024, ' ');
  auto oversized = client_->Post("/v1/jobs", headers_a_, huge, "application/json");
  ASSERT_EQ(oversized->status, 413);
  EXPECT_THAT(oversized->body, HasSubstr("\"code\":413"));
  EXPECT_THAT(oversized->body, HasSubstr("RESOURCE_EXHAUSTED"));
}

TEST_F(RestGatewayTest, ErrorsHaveTheRightStatus) {
  auto no_token = client_->Post("/v1/jobs", kSpec, "application/json");
  EXPECT_EQ(no_token->status, 401);
  auto malformed = client_->Post("/v1/jobs", headers_a_, "{\"model\": ", "application/json");
  EXPECT_EQ(malformed->status, 400);
  EXPECT_THAT(malformed->body, HasSubstr("request body"));
  auto unknown_field =
      client_->Post("/v1/jobs", headers_a_, R"({"modle": {}})", "application/json");
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

TEST_F(RestGatewayTest, WatchStreamsEveryChangeAsJsonLinesUntilTheJobEnds) {
  const std::string name = Create();
  EXPECT_EQ(client_->Get(("/v1/" + name + ":watch").c_str(), headers_b_)->status, 404);
  EXPECT_EQ(client_->Get(("/v1/" + name + ":watch").c_str())->status, 401);

  std::thread lifecycle([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    ASSERT_TRUE(jobs_->Transition(name, v1::Job::SCHEDULED).ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    ASSERT_TRUE(jobs_->Transition(name, v1::Job::RUNNING).ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    ASSERT_TRUE(jobs_->CancelJob(-1, name, "enough").ok());
  });
  auto watched = client_->Get(("/v1/" + name + ":watch").c_str(), headers_a_);
  lifecycle.join();
  ASSERT_TRUE(watched);
  ASSERT_EQ(watched->status, 200) << watched->body;
  EXPECT_EQ(watched->get_header_value("Content-Type"), "application/x-ndjson");
  std::vector<std::string> states;
  for (const std::string& line : Lines(watched->body)) {
    v1::Job job;
    ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(line, &job).ok()) << line;
    EXPECT_EQ(job.name(), name);
    states.push_back(v1::Job::State_Name(job.state()));
  }
  EXPECT_THAT(states, ::testing::ElementsAre("PENDING", "SCHEDULED", "RUNNING", "CANCELLED"));
}

TEST_F(RestGatewayTest, LogsStreamAsJsonLinesPerRankAndAfterSeq) {
  const std::string name = Create();
  const std::string id = name.substr(5);
  for (int rank = 0; rank < 2; ++rank) {
    for (int seq = 1; seq <= 3; ++seq) {
      ASSERT_TRUE(pool_
                      ->Exec("INSERT INTO job_logs (job_id, attempt, rank, stream, seq, line)"
                             " VALUES ($1::uuid, 0, $2, 'STDOUT', $3, $4)",
                             {id, rank, seq, absl::StrCat("rank ", rank, " line ", seq)})
                      .ok());
    }
  }
  auto all = client_->Get(("/v1/" + name + "/logs").c_str(), headers_a_);
  ASSERT_EQ(all->status, 200) << all->body;
  EXPECT_EQ(Lines(all->body).size(), 6u);
  auto rank1 = client_->Get(("/v1/" + name + "/logs?rank=1&afterSeq=1").c_str(), headers_a_);
  ASSERT_EQ(rank1->status, 200);
  const std::vector<std::string> lines = Lines(rank1->body);
  ASSERT_EQ(lines.size(), 2u) << rank1->body;
  v1::LogEntry entry;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(lines[0], &entry).ok());
  EXPECT_EQ(entry.rank(), 1);
  EXPECT_EQ(entry.seq(), 2);
  EXPECT_EQ(entry.text(), "rank 1 line 2");
  EXPECT_EQ(client_->Get(("/v1/" + name + "/logs?follow=maybe").c_str(), headers_a_)->status, 400);
  EXPECT_EQ(client_->Get(("/v1/" + name + "/logs").c_str(), headers_b_)->status, 404);
}

TEST_F(RestGatewayTest, EventsArePagedAndFilteredAndCancelKeepsItsReason) {
  const std::string name = Create();
  auto cancelled = client_->Post(("/v1/" + name + ":cancel").c_str(), headers_a_,
                                 R"({"reason": "wrong dataset"})", "application/json");
  ASSERT_EQ(cancelled->status, 200) << cancelled->body;
  EXPECT_THAT(cancelled->body, HasSubstr("wrong dataset"));
  EXPECT_FALSE(cancelled->get_header_value("ETag").empty());

  auto first = client_->Get(("/v1/" + name + "/events?pageSize=1").c_str(), headers_a_);
  ASSERT_EQ(first->status, 200) << first->body;
  v1::ListJobEventsResponse page;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(first->body, &page).ok());
  ASSERT_EQ(page.events_size(), 1);
  ASSERT_FALSE(page.next_page_token().empty());
  auto rest = client_->Get(
      ("/v1/" + name + "/events?pageSize=10&pageToken=" + page.next_page_token()).c_str(),
      headers_a_);
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(rest->body, &page).ok());
  EXPECT_EQ(page.events_size(), 2);  // cancel requested, cancelled
  EXPECT_TRUE(page.next_page_token().empty());
  auto requested =
      client_->Get(("/v1/" + name + "/events?filter=type%3DCANCEL_REQUESTED").c_str(), headers_a_);
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(requested->body, &page).ok());
  ASSERT_EQ(page.events_size(), 1);
  EXPECT_EQ(page.events(0).message(), "wrong dataset");
  auto bad = client_->Get(("/v1/" + name + "/events?filter=colour%3Dred").c_str(), headers_a_);
  EXPECT_EQ(bad->status, 400);
  EXPECT_THAT(bad->body, HasSubstr("colour"));
}

TEST_F(RestGatewayTest, AdminTokenReadsEveryTenantsJobsButCreatesNone) {
  const std::string name = Create();
  auto got = client_->Get(("/v1/" + name).c_str(), admin_);
  ASSERT_EQ(got->status, 200) << got->body;
  EXPECT_THAT(got->body, HasSubstr("tenants/team-a"));
  auto listed = client_->Get("/v1/jobs", admin_);
  EXPECT_THAT(listed->body, HasSubstr(name));
  auto created = client_->Post("/v1/jobs", admin_, kSpec, "application/json");
  EXPECT_EQ(created->status, 403);
  EXPECT_THAT(created->body, HasSubstr("tenant token"));
}

TEST_F(RestGatewayTest, JobMetricsAreDownsampledAsJson) {
  const std::string name = Create();
  // 1..100, an evaluation at 50: what NodeManager records from rank 0's lines.
  ASSERT_TRUE(pool_
                  ->Exec("INSERT INTO job_metric_points (job_id, step, attempt, loss,"
                         " learning_rate, samples_per_second, eval_metrics)"
                         " SELECT $1::uuid, s, 1, 1.0 / s, 0.1, 250,"
                         "   CASE WHEN s = 50 THEN '{\"accuracy\": 0.9}'::jsonb END"
                         " FROM generate_series(1, 100) AS s",
                         {name.substr(5)})
                  .ok());
  auto got = client_->Get(("/v1/" + name + "/metrics?maxPoints=10").c_str(), headers_a_);
  ASSERT_EQ(got->status, 200) << got->body;
  EXPECT_EQ(got->get_header_value("Content-Type"), "application/json");
  v1::JobMetrics metrics;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(got->body, &metrics).ok()) << got->body;
  EXPECT_EQ(metrics.name(), name);
  EXPECT_EQ(metrics.recorded_points(), 100);
  ASSERT_LE(metrics.points_size(), 10);
  ASSERT_GE(metrics.points_size(), 3);
  EXPECT_EQ(metrics.points(0).step(), 1);
  EXPECT_EQ(metrics.points(metrics.points_size() - 1).step(), 100);
  EXPECT_THAT(got->body, HasSubstr(R"("evalMetrics":{"accuracy":0.9})"));
  EXPECT_THAT(got->body, HasSubstr(R"("samplesPerSecond":250)"));
  // Without maxPoints: the default (500), so all of them here.
  auto all = client_->Get(("/v1/" + name + "/metrics").c_str(), headers_a_);
  ASSERT_EQ(all->status, 200) << all->body;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(all->body, &metrics).ok());
  EXPECT_EQ(metrics.points_size(), 100);

  EXPECT_EQ(client_->Get(("/v1/" + name + "/metrics").c_str(), headers_b_)->status, 404);
  EXPECT_EQ(client_->Get(("/v1/" + name + "/metrics").c_str())->status, 401);
  EXPECT_EQ(client_->Get(("/v1/" + name + "/metrics").c_str(), admin_)->status, 200);
  auto negative = client_->Get(("/v1/" + name + "/metrics?maxPoints=-1").c_str(), headers_a_);
  EXPECT_EQ(negative->status, 400);
  EXPECT_THAT(negative->body, HasSubstr("max_points"));
  auto huge = client_->Get(("/v1/" + name + "/metrics?maxPoints=10001").c_str(), headers_a_);
  EXPECT_EQ(huge->status, 400);
  auto words = client_->Get(("/v1/" + name + "/metrics?maxPoints=ten").c_str(), headers_a_);
  EXPECT_EQ(words->status, 400);
  EXPECT_THAT(words->body, HasSubstr("maxPoints"));
}

TEST_F(RestGatewayTest, MetricsCountRequestsByMethodAndCodeAndJobsByState) {
  Create();
  Create();
  // Refused from its headers, before routing: a body without a token reaches no rpc.
  ASSERT_EQ(client_->Post("/v1/jobs", kSpec, "application/json")->status, 401);
  auto unrouted = client_->Get("/v2/nothing");
  ASSERT_EQ(unrouted->status, 404);
  EXPECT_THAT(unrouted->body, HasSubstr("NOT_FOUND")) << "httplib's own errors, same shape";
  // A request is recorded after its last byte is sent (httplib's logger), so the client may
  // read an answer a moment before the server has counted it: scrape until all five are.
  std::string text;
  for (auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
       std::chrono::steady_clock::now() < deadline;
       std::this_thread::sleep_for(std::chrono::milliseconds(20))) {
    auto scraped = client_->Get("/metrics");
    ASSERT_EQ(scraped->status, 200);
    text = scraped->body;
    if (text.find(R"(code="UNAUTHENTICATED",method="unrouted")") != std::string::npos &&
        text.find(R"(code="NOT_FOUND",method="unrouted")") != std::string::npos) {
      break;
    }
  }
  EXPECT_THAT(
      text,
      HasSubstr(
          R"(gradhub_api_requests_total{code="OK",method="JobService.CreateJob",transport="rest"} 2)"));
  EXPECT_THAT(
      text,
      HasSubstr(
          R"(gradhub_api_requests_total{code="UNAUTHENTICATED",method="unrouted",transport="rest"} 1)"));
  EXPECT_THAT(
      text,
      HasSubstr(
          R"(gradhub_api_request_duration_seconds_count{method="JobService.CreateJob",transport="rest"} 2)"));
  EXPECT_THAT(
      text,
      HasSubstr(
          R"(gradhub_api_requests_total{code="NOT_FOUND",method="unrouted",transport="rest"} 1)"));
  EXPECT_THAT(text, HasSubstr(R"(gradhub_jobs{state="PENDING"} 2)"));
  EXPECT_THAT(text, HasSubstr(R"(gradhub_jobs{state="RUNNING"} 0)"));
  EXPECT_THAT(text, HasSubstr("gradhub_api_database_up 1"));
}

// A message from a 200 answer's JSON body.
template <typename Message>
Message Parsed(const httplib::Result& answer) {
  Message message;
  EXPECT_TRUE(answer) << "no answer";
  if (!answer) return message;
  EXPECT_EQ(answer->status, 200) << answer->body;
  const auto parsed = google::protobuf::util::JsonStringToMessage(answer->body, &message);
  EXPECT_TRUE(parsed.ok()) << parsed << "\n" << answer->body;
  return message;
}

// nodes.proto's operator routes, for the admin token alone, over the same NodeManager as
// NodeService.
TEST_F(RestGatewayTest, NodeRoutesListGetCordonAndDrainForTheAdminOnly) {
  for (const char* name : {"node-1", "node-2"}) {
    v1::RegisterNodeRequest registered;
    registered.mutable_node()->set_name(name);
    registered.mutable_node()->set_slots(2);
    ASSERT_TRUE(nodes_->RegisterNode(registered).ok());
  }
  const auto listed = Parsed<v1::ListNodesResponse>(client_->Get("/v1/nodes", admin_));
  ASSERT_EQ(listed.nodes_size(), 2);
  EXPECT_EQ(listed.nodes(0).name(), "nodes/node-1");
  const auto page = Parsed<v1::ListNodesResponse>(client_->Get("/v1/nodes?pageSize=1", admin_));
  ASSERT_EQ(page.nodes_size(), 1);
  EXPECT_FALSE(page.next_page_token().empty());
  EXPECT_EQ(Parsed<v1::Node>(client_->Get("/v1/nodes/node-2", admin_)).slots(), 2);

  const auto cordoned = Parsed<v1::Node>(
      client_->Post("/v1/nodes/node-1:cordon", admin_, R"({"cordon": true})", "application/json"));
  EXPECT_EQ(cordoned.state(), v1::Node::CORDONED);
  const auto filtered =
      Parsed<v1::ListNodesResponse>(client_->Get("/v1/nodes?filter=state%3DCORDONED", admin_));
  ASSERT_EQ(filtered.nodes_size(), 1);
  EXPECT_EQ(filtered.nodes(0).name(), "nodes/node-1");
  const auto uncordoned = Parsed<v1::Node>(
      client_->Post("/v1/nodes/node-1:cordon", admin_, R"({"cordon": false})", "application/json"));
  EXPECT_EQ(uncordoned.state(), v1::Node::READY);

  // A drain without a body, as `curl -X POST` sends it; the scheduler is told at once.
  const std::string drained = RawPost(port_, "/v1/nodes/node-2:drain", admin_.begin()->second);
  EXPECT_THAT(drained, ::testing::StartsWith("HTTP/1.1 200")) << drained;
  EXPECT_THAT(drained, HasSubstr("DRAINING"));
  EXPECT_EQ(nodes_changed_, 1);

  EXPECT_EQ(client_->Get("/v1/nodes/node-9", admin_)->status, 404);
  EXPECT_EQ(client_->Get("/v1/nodes?filter=colour%3Dred", admin_)->status, 400);
  auto typo =
      client_->Post("/v1/nodes/node-1:cordon", admin_, R"({"cordn": true})", "application/json");
  EXPECT_EQ(typo->status, 400);
  EXPECT_THAT(typo->body, HasSubstr("cordn"));
  EXPECT_EQ(client_->Get("/v1/nodes")->status, 401);
  auto tenant = client_->Get("/v1/nodes", headers_a_);
  EXPECT_EQ(tenant->status, 403);
  EXPECT_THAT(tenant->body, HasSubstr("admin token"));
  EXPECT_EQ(client_->Post("/v1/nodes/node-1:drain", headers_a_, "", "application/json")->status,
            403);
  EXPECT_EQ(nodes_changed_, 1) << "a refused drain changes nothing";
}

// tenants.proto's AdminService routes: a tenant, its token, the token at work, then revoked.
TEST_F(RestGatewayTest, TenantRoutesCreateListAndIssueAndRevokeTokensForTheAdminOnly) {
  const auto created =
      Parsed<v1::Tenant>(client_->Post("/v1/tenants?tenantId=team-c&requestId=c1", admin_,
                                       R"({"displayName": "Team C"})", "application/json"));
  EXPECT_EQ(created.name(), "tenants/team-c");
  EXPECT_EQ(created.display_name(), "Team C");
  const auto retried = Parsed<v1::Tenant>(
      client_->Post("/v1/tenants?tenantId=team-c&requestId=c1", admin_, "{}", "application/json"));
  EXPECT_EQ(retried.name(), "tenants/team-c");
  for (const char* retry :
       {"/v1/tenants?tenantId=team-c", "/v1/tenants?tenantId=team-c&requestId=c2",
        "/v1/tenants?tenantId=team-a&requestId=c1"}) {
    EXPECT_EQ(client_->Post(retry, admin_, "{}", "application/json")->status, 409) << retry;
  }
  auto bad_name = client_->Post("/v1/tenants?tenantId=Team_C", admin_, "{}", "application/json");
  EXPECT_EQ(bad_name->status, 400);
  EXPECT_THAT(bad_name->body, HasSubstr("must match"));

  const auto first =
      Parsed<v1::ListTenantsResponse>(client_->Get("/v1/tenants?pageSize=2", admin_));
  ASSERT_EQ(first.tenants_size(), 2);
  EXPECT_EQ(first.tenants(0).name(), "tenants/team-a");
  const auto second = Parsed<v1::ListTenantsResponse>(client_->Get(
      ("/v1/tenants?pageSize=2&pageToken=" + first.next_page_token()).c_str(), admin_));
  ASSERT_EQ(second.tenants_size(), 1);
  EXPECT_EQ(second.tenants(0).name(), "tenants/team-c");

  const auto token = Parsed<v1::CreateTokenResponse>(
      client_->Post("/v1/tenants/team-c/tokens", admin_,
                    R"({"kind": "TENANT", "description": "ci"})", "application/json"));
  ASSERT_FALSE(token.secret().empty());
  EXPECT_EQ(token.token().description(), "ci");
  const httplib::Headers team_c = {{"Authorization", "Bearer " + token.secret()}};
  EXPECT_EQ(client_->Get("/v1/jobs", team_c)->status, 200);
  const auto revoked = Parsed<v1::Token>(client_->Post(
      ("/v1/" + token.token().name() + ":revoke").c_str(), admin_, "", "application/json"));
  EXPECT_TRUE(revoked.has_revoke_time());
  EXPECT_EQ(client_->Get("/v1/jobs", team_c)->status, 401);
  EXPECT_EQ(client_->Post("/v1/tenants/team-c/tokens/999999:revoke", admin_, "", "application/json")
                ->status,
            404);

  EXPECT_EQ(client_->Get("/v1/tenants")->status, 401);
  EXPECT_EQ(client_->Get("/v1/tenants", headers_a_)->status, 403);
  EXPECT_EQ(
      client_->Post("/v1/tenants?tenantId=team-d", headers_a_, "{}", "application/json")->status,
      403);
  EXPECT_EQ(client_
                ->Post("/v1/tenants/team-a/tokens", headers_a_, R"({"kind": "TENANT"})",
                       "application/json")
                ->status,
            403);
}

TEST_F(RestGatewayTest, ServesHttpsWithTheGivenCertificateAndRefusesAnUnusableOne) {
  char dir_template[] = "/tmp/gradhub-tls-XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  const std::filesystem::path dir = dir_template;
  const std::string cert = dir / "cert.pem", key = dir / "key.pem";
  const std::string command = absl::StrCat(
      "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=localhost"
      " -addext subjectAltName=IP:127.0.0.1 -keyout ",
      key, " -out ", cert, " 2>/dev/null");
  ASSERT_EQ(std::system(command.c_str()), 0) << command;

  RestGatewayOptions options;
  options.tls_cert_file = cert;
  options.tls_key_file = key;
  RestGateway tls(Backends(), options);
  const absl::StatusOr<int> port = tls.Start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok()) << port.status();
  httplib::SSLClient verified("127.0.0.1", *port);
  verified.set_ca_cert_path(cert.c_str());
  verified.enable_server_certificate_verification(true);
  auto health = verified.Get("/healthz");
  ASSERT_TRUE(health) << httplib::to_string(health.error());
  EXPECT_EQ(health->status, 200);
  httplib::Client plain("127.0.0.1", *port);
  auto refused = plain.Get("/healthz");
  EXPECT_TRUE(!refused || refused->status != 200) << "plain HTTP on the TLS port";

  options.tls_key_file = cert;  // not a key
  RestGateway unusable(Backends(), options);
  const absl::StatusOr<int> failed = unusable.Start("127.0.0.1", 0);
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(failed.status().message(), HasSubstr("tls"));
  std::filesystem::remove_all(dir);
}

// kSpec with `field` (a JSON member, e.g. R"("precision": 7)") added at its top.
std::string SpecWith(const std::string& member) {
  return "{" + member + "," + std::string(kSpec).substr(1);
}

// A 400 INVALID_ARGUMENT whose message names `field`, and nothing of the database in it.
void ExpectRefusedNaming(const httplib::Result& answer, const std::string& field,
                         const std::string& what) {
  ASSERT_TRUE(answer) << what;
  EXPECT_EQ(answer->status, 400) << what << ": " << answer->body;
  EXPECT_THAT(answer->body, HasSubstr("INVALID_ARGUMENT")) << what;
  EXPECT_THAT(answer->body, HasSubstr(field)) << what << ": " << answer->body;
  for (const char* leak : {"SELECT", "INSERT", "WHERE", "SQLSTATE", "jsonb", "postgres", "relation",
                           "syntax", "out of range", "invalid byte"}) {
    EXPECT_THAT(answer->body, ::testing::Not(HasSubstr(leak))) << what << ": " << answer->body;
  }
}

// Each class the probe of the REST API found, one bad body or query per instance: refused as
// INVALID_ARGUMENT naming the field, never with SQL, and nothing created.
TEST_F(RestGatewayTest, BodiesTheProtoCannotMeanAreRefusedNamingTheField) {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {R"("precision": 7)", "precision"},
      {R"("distributed": {"backend": 42})", "distributed.backend"},
      {R"("lrSchedule": {"step": {"stepSize": 5, "gamma": "NaN"}})", "lrSchedule.step.gamma"},
      {R"("gradClipNorm": "Infinity")", "gradClipNorm"},
      {R"("gradClipNorm": "-Infinity")", "gradClipNorm"},
      {R"("gradClipNorm": 1e999)", "request body"},
      {R"("labels": {"a": [["b"]]})", "labels.a"},
      {R"("displayName": "a\u0000b")", "displayName"},
      {R"("labels": {"team": "x\u0000"})", "labels.team"},
      {R"("memoryPerRankMib": "16777217")", "memoryPerRankMib"},
      {R"("distributed": {"backend": "NCCL", "encryptTraffic": true})",
       "distributed.encryptTraffic"},
      {R"("display_name": "twice")", "displayName: is given twice"},
  };
  for (const auto& [member, field] : bad) {
    ExpectRefusedNaming(client_->Post("/v1/jobs", headers_a_, SpecWith(member), "application/json"),
                        field, member);
  }
  // Lists inside lists: protobuf alone flattens them into one list.
  std::string nested = kSpec;
  nested.replace(nested.find("[64, 10]"), 8, "[[64], [10]]");
  ExpectRefusedNaming(client_->Post("/v1/jobs", headers_a_, nested, "application/json"),
                      "model.mlp.layers[0]", nested);
  auto listed = Parsed<v1::ListJobsResponse>(client_->Get("/v1/jobs", headers_a_));
  EXPECT_EQ(listed.jobs_size(), 0);
}

TEST_F(RestGatewayTest, NulAndBadPageTokensInQueriesAndPathsAreRefusedNamingThem) {
  ASSERT_EQ(client_->Post("/v1/jobs?requestId=r1", headers_a_, kSpec, "application/json")->status,
            200);
  // A NUL in requestId would be cut by libpq and found as r1: a retry of another request.
  ExpectRefusedNaming(
      client_->Post("/v1/jobs?requestId=r1%00x", headers_a_, kSpec, "application/json"),
      "requestId", "NUL in requestId");
  ExpectRefusedNaming(
      client_->Post("/v1/jobs?requestId=r1%FF", headers_a_, kSpec, "application/json"), "requestId",
      "invalid UTF-8 in requestId");
  EXPECT_EQ(Parsed<v1::ListJobsResponse>(client_->Get("/v1/jobs", headers_a_)).jobs_size(), 1);
  ExpectRefusedNaming(client_->Get("/v1/jobs?filter=state%3DPENDING%00", headers_a_), "filter",
                      "NUL in a filter");
  ExpectRefusedNaming(
      client_->Post("/v1/tenants/team-a%00x/tokens", admin_, "{}", "application/json"), "name",
      "NUL in a path");
  // Out-of-range and foreign page tokens, in every list.
  const std::string huge = MakePageToken("jobs", {"9223372036854775807", "0"});
  for (const std::string& path : std::vector<std::string>{
           "/v1/jobs?pageToken=99999999999999999%2F00000000-0000-0000-0000-000000000000",
           "/v1/jobs?pageToken=" + huge}) {
    ExpectRefusedNaming(client_->Get(path.c_str(), headers_a_), "page_token", path);
  }
  ExpectRefusedNaming(client_->Get("/v1/jobs?pageToken=%00", headers_a_), "pageToken", "NUL");
  for (const char* path : {"/v1/tenants?pageToken=team-a", "/v1/nodes?pageToken=node-1"}) {
    ExpectRefusedNaming(client_->Get(path, admin_), "page_token", path);
  }
}

// kSpec with its displayName replaced by `name`.
std::string SpecNamed(const std::string& name) {
  std::string spec = kSpec;
  const size_t start = spec.find("\"displayName\"");
  spec.replace(start, spec.find('\n', start) - start, "\"displayName\": \"" + name + "\",");
  return spec;
}

TEST_F(RestGatewayTest, DisplayNamesAreCountedInCharacters) {
  std::string name;
  for (int i = 0; i < 256; ++i) name += "\xc3\xa9";  // 256 characters, 512 bytes
  auto fits = client_->Post("/v1/jobs", headers_a_, SpecNamed(name), "application/json");
  EXPECT_EQ(fits->status, 200) << fits->body;
  auto longer = client_->Post("/v1/jobs", headers_a_, SpecNamed(name + "x"), "application/json");
  ExpectRefusedNaming(longer, "displayName: is 257 characters long; at most 256", "257");
  EXPECT_THAT(longer->body, HasSubstr("Unicode code points"));
}

}  // namespace
}  // namespace gradhub::api
