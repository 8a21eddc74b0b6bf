// The HTTP listener of every gradhub REST server (services/common/http_server.h) against hostile
// clients, over real sockets on loopback: connection limits per client and in all, header and
// body times, bodies bounded whatever their framing, requests refused from their headers alone,
// and probes that stay fast while slow clients hold connections.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "services/common/http_server.h"
#include "tests/support/raw_http_client.h"

namespace gradhub {
namespace {

using ::gradhub::testing::RawHttpClient;
using ::gradhub::testing::StatusOf;
using ::testing::HasSubstr;

constexpr absl::Duration kAnswerTime = absl::Seconds(5);

// A server with a probe, a body-taking route (counting the calls that reach it) and, when the
// options ask, admit_body; started on a free port.
class EdgeServer {
 public:
  explicit EdgeServer(HttpServerOptions options) : options_(std::move(options)) {
    server_ = MakeHttpServer(options_);
    server_->Get("/healthz", [](const httplib::Request&, httplib::Response& response) {
      response.set_content("ok\n", "text/plain");
    });
    server_->Post("/echo", [this](const httplib::Request& request, httplib::Response& response) {
      ++handled_;
      response.set_content(absl::StrCat(request.body.size(), "\n"), "text/plain");
    });
    const absl::StatusOr<int> port = StartHttpServer(*server_, options_, "127.0.0.1", 0, &thread_);
    EXPECT_TRUE(port.ok()) << port.status();
    port_ = port.value_or(0);
  }
  ~EdgeServer() {
    server_->stop();
    if (thread_.joinable()) thread_.join();
  }

  int port() const { return port_; }
  int handled() const { return handled_; }

  // How long /healthz takes to answer a new client from `source`; a failure counts as a minute.
  absl::Duration ProbeTime(const std::string& source = "127.0.0.1") const {
    const absl::Time start = absl::Now();
    RawHttpClient probe(port_, source);
    if (!probe.Send("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")) return absl::Minutes(1);
    const std::string answer = probe.ReadHead(kAnswerTime);
    return StatusOf(answer) == 200 ? absl::Now() - start : absl::Minutes(1);
  }

 private:
  HttpServerOptions options_;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;
  std::atomic<int> handled_{0};
};

HttpServerOptions SmallLimits() {
  HttpServerOptions options;
  options.max_body_bytes = 64 << 10;
  options.limits.max_connections_per_client = 8;
  options.limits.header_timeout = absl::Seconds(10);
  return options;
}

// Connections that sent half a request line and nothing more, from `source`.
std::vector<std::unique_ptr<RawHttpClient>> SlowClients(int port, int count,
                                                        const std::string& source) {
  std::vector<std::unique_ptr<RawHttpClient>> clients;
  for (int i = 0; i < count; ++i) {
    clients.push_back(std::make_unique<RawHttpClient>(port, source));
    EXPECT_TRUE(clients.back()->Send("GET /heal"));
  }
  return clients;
}

TEST(HttpEdgeTest, AClientOverItsConnectionLimitIsRefusedWhileAnotherIsServed) {
  EdgeServer server(SmallLimits());
  const auto held = SlowClients(server.port(), 8, "127.0.0.2");
  RawHttpClient over(server.port(), "127.0.0.2");
  const std::string refusal = over.ReadUntilClosed(kAnswerTime);
  EXPECT_EQ(StatusOf(refusal), 429) << refusal;
  EXPECT_THAT(refusal, HasSubstr("--http-max-connections-per-client"));
  EXPECT_LT(server.ProbeTime("127.0.0.3"), absl::Milliseconds(100));
}

TEST(HttpEdgeTest, ProbesAnswerWithin100msWhile200SlowClientsHoldConnections) {
  HttpServerOptions options = SmallLimits();
  options.limits.max_connections_per_client = 64;
  EdgeServer server(options);
  std::vector<std::unique_ptr<RawHttpClient>> held;
  for (const char* source : {"127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"}) {
    for (auto& client : SlowClients(server.port(), 50, source)) held.push_back(std::move(client));
  }
  absl::SleepFor(absl::Milliseconds(500));  // held: the server has taken every one in
  for (int i = 0; i < 5; ++i) EXPECT_LT(server.ProbeTime(), absl::Milliseconds(100));
}

TEST(HttpEdgeTest, WhenEveryConnectionIsTakenBySlowClientsTheLongestWaitingMakesRoom) {
  HttpServerOptions options = SmallLimits();
  options.limits.max_connections = 40;
  EdgeServer server(options);
  std::vector<std::unique_ptr<RawHttpClient>> held;
  for (int i = 0; i < 5; ++i) {
    for (auto& client : SlowClients(server.port(), 8, absl::StrCat("127.0.1.", i + 1))) {
      held.push_back(std::move(client));
    }
  }
  EXPECT_LT(server.ProbeTime(), absl::Milliseconds(100));
  EXPECT_TRUE(held.front()->ClosedWithin(kAnswerTime)) << "the oldest slow client made room";
}

TEST(HttpEdgeTest, HeadersNotInWithinTheHeaderTimeAre408AndAnIdleConnectionIsClosed) {
  HttpServerOptions options = SmallLimits();
  options.limits.header_timeout = absl::Milliseconds(300);
  EdgeServer server(options);
  RawHttpClient slow(server.port()), idle(server.port());
  ASSERT_TRUE(slow.Send("GET /healthz HTTP/1.1\r\nHost: x\r\n"));
  const absl::Time start = absl::Now();
  const std::string answer = slow.ReadUntilClosed(kAnswerTime);
  EXPECT_EQ(StatusOf(answer), 408) << answer;
  EXPECT_THAT(answer, HasSubstr("--http-header-timeout"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  EXPECT_EQ(idle.ReadUntilClosed(kAnswerTime), "") << "nothing was asked, nothing is answered";
}

TEST(HttpEdgeTest, AChunkedBodyOverTheLimitIs413WithoutBeingReadWhole) {
  EdgeServer server(SmallLimits());
  RawHttpClient client(server.port());
  ASSERT_TRUE(client.Send("POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"));
  const uint64_t sent =
      client.SendBodyUntilAnswered(uint64_t{1} << 30, /*chunked=*/true, absl::Seconds(20));
  const std::string answer = client.ReadUntilClosed(kAnswerTime);
  EXPECT_EQ(StatusOf(answer), 413) << answer;
  EXPECT_THAT(answer, HasSubstr("\"code\":413"));
  // The socket buffers of loopback hold a few MiB; the rest of the GiB was never taken.
  EXPECT_LT(sent, uint64_t{64} << 20);
  EXPECT_EQ(server.handled(), 0);
}

TEST(HttpEdgeTest, AContentLengthOverTheLimitIs413BeforeAByteOfTheBody) {
  EdgeServer server(SmallLimits());
  RawHttpClient client(server.port());
  ASSERT_TRUE(client.Send("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1073741824\r\n\r\n"));
  const std::string answer = client.ReadUntilClosed(kAnswerTime);
  EXPECT_EQ(StatusOf(answer), 413) << answer;
  EXPECT_THAT(answer, HasSubstr("Connection: close"));
  EXPECT_EQ(server.handled(), 0);
}

TEST(HttpEdgeTest, ABodyThatAdmitBodyRefusesIsAnsweredFromTheHeadersUnread) {
  HttpServerOptions options = SmallLimits();
  options.max_body_bytes = uint64_t{1} << 30;
  options.admit_body = [](const httplib::Request& request) {
    return request.get_header_value("Authorization") == "Bearer good"
               ? absl::OkStatus()
               : absl::UnauthenticatedError("a valid bearer token is required");
  };
  EdgeServer server(options);
  RawHttpClient client(server.port());
  ASSERT_TRUE(client.Send("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 268435456\r\n\r\n"));
  const uint64_t sent =
      client.SendBodyUntilAnswered(uint64_t{256} << 20, /*chunked=*/false, absl::Seconds(20));
  const std::string answer = client.ReadUntilClosed(kAnswerTime);
  EXPECT_EQ(StatusOf(answer), 401) << answer;
  EXPECT_LT(sent, uint64_t{32} << 20) << "the answer came long before the body was sent";
  EXPECT_EQ(server.handled(), 0);

  httplib::Client good("127.0.0.1", server.port());
  const auto served = good.Post("/echo", {{"Authorization", "Bearer good"}}, "abc", "text/plain");
  ASSERT_TRUE(served);
  EXPECT_EQ(served->status, 200);
  EXPECT_EQ(served->body, "3\n");
}

TEST(HttpEdgeTest, AClientThatExpects100ContinueGetsItOrItsRefusalBeforeSendingTheBody) {
  HttpServerOptions options = SmallLimits();
  options.admit_body = [](const httplib::Request& request) {
    return request.has_header("Authorization") ? absl::OkStatus()
                                               : absl::UnauthenticatedError("no token");
  };
  EdgeServer server(options);
  RawHttpClient admitted(server.port());
  ASSERT_TRUE(
      admitted.Send("POST /echo HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer t\r\n"
                    "Content-Length: 5\r\nExpect: 100-continue\r\n\r\n"));
  EXPECT_EQ(StatusOf(admitted.ReadHead(kAnswerTime)), 100);
  ASSERT_TRUE(admitted.Send("hello"));
  const std::string answer = admitted.ReadHead(kAnswerTime);
  EXPECT_EQ(StatusOf(answer), 200) << answer;

  RawHttpClient refused(server.port());
  ASSERT_TRUE(
      refused.Send("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
                   "Expect: 100-continue\r\n\r\n"));
  EXPECT_EQ(StatusOf(refused.ReadUntilClosed(kAnswerTime)), 401);
  EXPECT_EQ(server.handled(), 1);
}

TEST(HttpEdgeTest, AmbiguousOrCompressedBodiesAreRefusedFromTheirHeaders) {
  EdgeServer server(SmallLimits());
  const std::vector<std::pair<std::string, int>> cases = {
      {"Content-Length: 3\r\nTransfer-Encoding: chunked\r\n", 400},
      {"Transfer-Encoding: gzip, chunked\r\n", 501},
      {"Content-Length: 3\r\nContent-Encoding: gzip\r\n", 415},
      {"Content-Length: 3, 3\r\n", 400}};
  for (const auto& [headers, status] : cases) {
    RawHttpClient client(server.port());
    ASSERT_TRUE(client.Send(absl::StrCat("POST /echo HTTP/1.1\r\nHost: x\r\n", headers, "\r\n")));
    const std::string answer = client.ReadUntilClosed(kAnswerTime);
    EXPECT_EQ(StatusOf(answer), status) << headers << answer;
  }
  EXPECT_EQ(server.handled(), 0);
}

TEST(HttpEdgeTest, ABodySentTooSlowlyIs408) {
  HttpServerOptions options = SmallLimits();
  options.limits.body_timeout = absl::Milliseconds(300);
  options.limits.body_min_rate = 1 << 20;
  EdgeServer server(options);
  RawHttpClient client(server.port());
  ASSERT_TRUE(client.Send("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 60000\r\n\r\nab"));
  const std::string answer = client.ReadUntilClosed(kAnswerTime);
  EXPECT_EQ(StatusOf(answer), 408) << answer;
  EXPECT_THAT(answer, HasSubstr("--http-body-min-rate"));
  EXPECT_EQ(server.handled(), 0);
}

TEST(HttpEdgeTest, APostWithNeitherLengthNorChunksHasAnEmptyBodyAtOnce) {
  EdgeServer server(SmallLimits());
  RawHttpClient client(server.port());
  ASSERT_TRUE(client.Send("POST /echo HTTP/1.1\r\nHost: x\r\n\r\n"));
  const std::string answer = client.ReadHead(absl::Seconds(2));
  EXPECT_EQ(StatusOf(answer), 200) << answer;
}

TEST(HttpEdgeTest, OrdinaryClientsKeepTheirConnectionForSeveralRequests) {
  EdgeServer server(SmallLimits());
  httplib::Client client("127.0.0.1", server.port());
  client.set_keep_alive(true);
  for (int i = 0; i < 4; ++i) {
    const auto posted = client.Post("/echo", std::string(1000, 'x'), "text/plain");
    ASSERT_TRUE(posted);
    EXPECT_EQ(posted->status, 200);
    EXPECT_EQ(posted->body, "1000\n");
    const auto probed = client.Get("/healthz");
    ASSERT_TRUE(probed);
    EXPECT_EQ(probed->status, 200);
  }
  EXPECT_EQ(server.handled(), 4);
}

TEST(HttpEdgeTest, LimitsOutOfRangeStopTheServerFromStartingNamingTheFlag) {
  HttpServerOptions options;
  options.limits.max_connections = 1;
  auto server = MakeHttpServer(options);
  std::thread thread;
  const absl::StatusOr<int> port = StartHttpServer(*server, options, "127.0.0.1", 0, &thread);
  ASSERT_TRUE(absl::IsInvalidArgument(port.status()));
  EXPECT_THAT(port.status().message(), HasSubstr("--http-max-connections"));
}

}  // namespace
}  // namespace gradhub
