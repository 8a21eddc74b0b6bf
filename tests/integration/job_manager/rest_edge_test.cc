// The REST gateway against hostile load (issue 36, "the REST and gRPC edge"), over real HTTP on
// loopback and backed by a real PostgreSQL: probes that answer within 100 ms while 200 slow
// clients and 200 authenticated watch streams are held open; the stream limit per tenant; bodies
// refused from their headers (no token, over the size) and chunked ones cut at the limit, each
// without the server reading them whole.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "services/api/rest_gateway.h"
#include "tests/integration/db/db_test_util.h"
#include "tests/support/job_specs.h"
#include "tests/support/raw_http_client.h"

namespace gradhub::api {
namespace {

using ::gradhub::testing::RawHttpClient;
using ::gradhub::testing::StatusOf;
using ::testing::HasSubstr;

constexpr absl::Duration kAnswerTime = absl::Seconds(10);
constexpr absl::Duration kProbeBudget = absl::Milliseconds(100);

// A tenant of the test: its token's Authorization header and one job of its own.
struct Tenant {
  std::string authorization;
  std::string job;  // "jobs/<uuid>"
};

// What a gateway needs, built in order, for a gateway with `options`.
struct Api {
  explicit Api(std::unique_ptr<db::Pool> db)
      : pool(std::move(db)),
        auth(pool.get(), "admin-secret-for-tests"),
        jobs(pool.get(), SpecLimits{}),
        nodes(pool.get(), NodeManagerOptions{}),
        tenants(&auth),
        metrics(pool.get()) {}

  RestBackends Backends() {
    RestBackends backends;
    backends.jobs = &jobs;
    backends.nodes = &nodes;
    backends.tenants = &tenants;
    backends.auth = &auth;
    backends.metrics = &metrics;
    return backends;
  }

  // A tenant named `name` with a token and a pending job.
  Tenant AddTenant(const std::string& name) {
    const absl::StatusOr<int64_t> id = auth.CreateTenant(name, "");
    EXPECT_TRUE(id.ok()) << id.status();
    const absl::StatusOr<NewToken> token = auth.CreateTenantToken(name, "");
    EXPECT_TRUE(token.ok()) << token.status();
    const absl::StatusOr<v1::Job> job =
        jobs.CreateJob(id.value_or(0), testing::MinimalJobSpec(), "");
    EXPECT_TRUE(job.ok()) << job.status();
    return {"Bearer " + token.value_or(NewToken{}).secret, job.ok() ? job->name() : ""};
  }

  std::unique_ptr<db::Pool> pool;
  Authenticator auth;
  JobManager jobs;
  NodeManager nodes;
  TenantManager tenants;
  ApiMetrics metrics;
};

class RestEdgeTest : public db::DatabaseTest {
 protected:
  void SetUp() override {
    db::DatabaseTest::SetUp();
    Migrate();
    api_ = std::make_unique<Api>(MakePool(8));
  }
  void TearDown() override {
    gateway_.reset();
    api_.reset();
  }

  // Starts the gateway with `options` (the defaults but a 64 KiB body limit).
  void Serve(RestGatewayOptions options = {}) {
    if (options.max_body_bytes == RestGatewayOptions{}.max_body_bytes) {
      options.max_body_bytes = 64 << 10;
    }
    gateway_ = std::make_unique<RestGateway>(api_->Backends(), options);
    const absl::StatusOr<int> port = gateway_->Start("127.0.0.1", 0);
    ASSERT_TRUE(port.ok()) << port.status();
    port_ = *port;
  }

  // A WatchJob stream of `tenant`'s job from `source`, once its first line (the job) is in;
  // nullptr when it was not answered 200.
  std::unique_ptr<RawHttpClient> Watch(const Tenant& tenant, const std::string& source,
                                       std::string* refusal = nullptr) {
    auto client = std::make_unique<RawHttpClient>(port_, source);
    const bool sent =
        client->Send(absl::StrCat("GET /v1/", tenant.job, ":watch HTTP/1.1\r\nHost: x",
                                  "\r\nAuthorization: ", tenant.authorization, "\r\n\r\n"));
    const std::string head = sent ? client->ReadHead(kAnswerTime) : "";
    if (StatusOf(head) == 200) return client;
    const std::string answer = client->ReadRestOfResponse(head, kAnswerTime);
    if (refusal == nullptr) ADD_FAILURE() << "not answered 200: " << answer;
    if (refusal != nullptr) *refusal = answer;
    return nullptr;
  }

  // How long /healthz takes to answer a new connection.
  absl::Duration ProbeTime() const {
    const absl::Time start = absl::Now();
    RawHttpClient probe(port_);
    const bool sent = probe.Send("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
    return sent && StatusOf(probe.ReadHead(kAnswerTime)) == 200 ? absl::Now() - start
                                                                : absl::Minutes(1);
  }

  // Sends POST /v1/jobs with `headers` and up to `body_bytes` of body as fast as the gateway
  // takes them; the answer, and in *sent the body bytes sent before it came.
  std::string PostJobs(const std::string& headers, uint64_t body_bytes, bool chunked,
                       uint64_t* sent) const {
    RawHttpClient client(port_);
    EXPECT_TRUE(client.Send(absl::StrCat("POST /v1/jobs HTTP/1.1\r\nHost: x\r\n", headers,
                                         "Content-Type: application/json\r\n\r\n")));
    *sent = client.SendBodyUntilAnswered(body_bytes, chunked, absl::Seconds(30));
    return client.ReadUntilClosed(kAnswerTime);
  }

  std::unique_ptr<Api> api_;
  std::unique_ptr<RestGateway> gateway_;
  int port_ = 0;
};

TEST_F(RestEdgeTest, HealthzAnswersWithin100msWhile200SlowClientsAnd200WatchStreamsAreOpen) {
  Serve();  // the default limits
  std::vector<Tenant> tenants;
  for (int i = 0; i < 8; ++i) tenants.push_back(api_->AddTenant(absl::StrCat("tenant-", i)));
  std::vector<std::unique_ptr<RawHttpClient>> held;
  for (int i = 0; i < 200; ++i) {  // 25 streams per tenant, 50 per address
    auto stream = Watch(tenants[i % 8], absl::StrCat("127.0.2.", i % 4 + 1));
    ASSERT_NE(stream, nullptr) << "stream " << i;
    held.push_back(std::move(stream));
  }
  for (int i = 0; i < 200; ++i) {  // headers never finished, 50 per address
    held.push_back(std::make_unique<RawHttpClient>(port_, absl::StrCat("127.0.3.", i % 4 + 1)));
    ASSERT_TRUE(held.back()->Send("GET /v1/jobs HTTP/1.1\r\nAuthorization: Bea"));
  }
  // Held open: the server has taken every connection in (it admits them in order).
  absl::SleepFor(absl::Milliseconds(500));
  std::vector<absl::Duration> probes;
  for (int i = 0; i < 10; ++i) probes.push_back(ProbeTime());
  EXPECT_LT(*std::max_element(probes.begin(), probes.end()), kProbeBudget)
      << absl::StrJoin(probes, ", ", [](std::string* out, absl::Duration d) {
           absl::StrAppend(out, absl::FormatDuration(d));
         });
  // The streams still stream: the first one got its job and is open.
  EXPECT_FALSE(held.front()->ClosedWithin(absl::Milliseconds(50)));
}

TEST_F(RestEdgeTest, ATenantOverItsStreamLimitGets429WhileAnotherTenantsStreamWorks) {
  RestGatewayOptions options;
  options.streams.max_streams_per_tenant = 3;
  Serve(options);
  const Tenant a = api_->AddTenant("team-a"), b = api_->AddTenant("team-b");
  std::vector<std::unique_ptr<RawHttpClient>> streams;
  for (int i = 0; i < 3; ++i) streams.push_back(Watch(a, "127.0.0.1"));
  std::string refusal;
  EXPECT_EQ(Watch(a, "127.0.0.1", &refusal), nullptr);
  EXPECT_EQ(StatusOf(refusal), 429) << refusal;
  EXPECT_THAT(refusal, HasSubstr("RESOURCE_EXHAUSTED"));
  EXPECT_THAT(refusal, HasSubstr("--http-max-streams-per-tenant"));
  EXPECT_NE(Watch(b, "127.0.0.1"), nullptr);
  // A stream that ends frees its slot.
  streams.pop_back();
  std::unique_ptr<RawHttpClient> again;
  for (int i = 0; i < 50 && again == nullptr; ++i) {
    absl::SleepFor(absl::Milliseconds(100));  // the gateway notices at its next write
    again = Watch(a, "127.0.0.1", &refusal);
  }
  EXPECT_NE(again, nullptr) << refusal;
}

TEST_F(RestEdgeTest, AnUnauthenticatedLargeBodyIs401BeforeTheGatewayReadsIt) {
  Serve();
  api_->AddTenant("team-a");
  for (const auto& [token, framing] :
       {std::pair<std::string, std::string>{"", "Content-Length: 536870912\r\n"},
        {"Authorization: Bearer ghk_not-a-token\r\n", "Content-Length: 536870912\r\n"},
        {"", "Transfer-Encoding: chunked\r\n"}}) {
    uint64_t sent = 0;
    const bool chunked = framing.find("chunked") != std::string::npos;
    const std::string answer = PostJobs(token + framing, uint64_t{512} << 20, chunked, &sent);
    EXPECT_EQ(StatusOf(answer), 401) << answer;
    EXPECT_THAT(answer, HasSubstr("UNAUTHENTICATED"));
    EXPECT_LT(sent, uint64_t{32} << 20) << "of a 512 MiB body";
  }
  const auto listed = httplib::Client("127.0.0.1", port_).Get("/healthz");
  ASSERT_TRUE(listed);
  EXPECT_EQ(listed->status, 200);
}

TEST_F(RestEdgeTest, AChunkedBodyOverTheLimitIs413WithoutBeingReadWhole) {
  Serve();
  const Tenant a = api_->AddTenant("team-a");
  uint64_t sent = 0;
  const std::string answer = PostJobs(
      absl::StrCat("Authorization: ", a.authorization, "\r\nTransfer-Encoding: chunked\r\n"),
      uint64_t{1} << 30, /*chunked=*/true, &sent);
  EXPECT_EQ(StatusOf(answer), 413) << answer;
  EXPECT_THAT(answer, HasSubstr("\"code\":413"));
  EXPECT_LT(sent, uint64_t{64} << 20) << "of a 1 GiB body";
}

TEST_F(RestEdgeTest, AClientOverItsConnectionLimitIsRefusedWhileAnotherIsServed) {
  RestGatewayOptions options;
  options.limits.max_connections_per_client = 4;
  Serve(options);
  std::vector<std::unique_ptr<RawHttpClient>> held;
  for (int i = 0; i < 4; ++i) {
    held.push_back(std::make_unique<RawHttpClient>(port_, "127.0.0.2"));
    ASSERT_TRUE(held.back()->Send("GET /heal"));
  }
  RawHttpClient over(port_, "127.0.0.2");
  const std::string refusal = over.ReadUntilClosed(kAnswerTime);
  EXPECT_EQ(StatusOf(refusal), 429) << refusal;
  EXPECT_THAT(refusal, HasSubstr("--http-max-connections-per-client"));
  EXPECT_LT(ProbeTime(), kProbeBudget);
}

}  // namespace
}  // namespace gradhub::api
