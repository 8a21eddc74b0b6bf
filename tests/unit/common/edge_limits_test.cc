// The pieces of the HTTP edge without a server: the stream slots, the connection table and its
// evictions (on real sockets), the framing rules, and the flags' ranges.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <optional>
#include <vector>

#include "services/common/edge_limits.h"
#include "services/common/http_connection_limits.h"
#include "services/common/http_request_stream.h"
#include "services/common/keyed_slots.h"

namespace gradhub {
namespace {

using ::testing::HasSubstr;

const KeyedSlots::Wording kStreams{.what = "streams",
                                   .key_noun = "tenant",
                                   .total_flag = "--max-total",
                                   .per_key_flag = "--max-per-tenant"};

TEST(KeyedSlotsTest, RefusesBeyondTheKeysLimitWhileAnotherKeyStillGetsOne) {
  KeyedSlots slots({.max_total = 10, .max_per_key = 2}, kStreams);
  auto a1 = slots.Acquire("a"), a2 = slots.Acquire("a");
  ASSERT_TRUE(a1.ok() && a2.ok());
  const auto a3 = slots.Acquire("a");
  ASSERT_TRUE(absl::IsResourceExhausted(a3.status())) << a3.status();
  EXPECT_THAT(a3.status().message(), HasSubstr("--max-per-tenant"));
  EXPECT_TRUE(slots.Acquire("b").ok());
  EXPECT_EQ(slots.held_by("a"), 2);
}

TEST(KeyedSlotsTest, RefusesBeyondTheTotalAndFreesASlotWhenItIsDestroyed) {
  KeyedSlots slots({.max_total = 2, .max_per_key = 2}, kStreams);
  std::optional<KeyedSlots::Slot> first = *slots.Acquire("a");
  auto second = slots.Acquire("b");
  const auto third = slots.Acquire("c");
  ASSERT_TRUE(absl::IsResourceExhausted(third.status()));
  EXPECT_THAT(third.status().message(), HasSubstr("--max-total"));
  first.reset();
  EXPECT_EQ(slots.held(), 1);
  EXPECT_TRUE(slots.Acquire("c").ok());
  EXPECT_EQ(slots.held(), 1) << "the slot acquired above was destroyed at once";
}

// A connected pair: the table holds `server`; `client` sees what the table does to it.
struct SocketPair {
  SocketPair() { ::socketpair(AF_UNIX, SOCK_STREAM, 0, fds); }
  ~SocketPair() {
    ::close(fds[0]);
    ::close(fds[1]);
  }
  int server() const { return fds[0]; }
  // True when the server's end was shut down (a read returns the end at once).
  bool ShutDown() const {
    char byte;
    return ::recv(fds[1], &byte, 1, MSG_DONTWAIT) == 0;
  }
  int fds[2] = {-1, -1};
};

HttpLimits Connections(int64_t total, int64_t per_client) {
  HttpLimits limits;
  limits.max_connections = total;
  limits.max_connections_per_client = per_client;
  return limits;
}

TEST(ConnectionTableTest, AClientOverItsLimitIsRefusedAndAnotherIsAdmitted) {
  ConnectionTable table(Connections(10, 2));
  SocketPair s1, s2, s3, s4;
  auto c1 = table.Admit(s1.server(), "10.0.0.1");
  auto c2 = table.Admit(s2.server(), "10.0.0.1");
  ASSERT_TRUE(c1.ok() && c2.ok());
  const auto c3 = table.Admit(s3.server(), "10.0.0.1");
  ASSERT_TRUE(absl::IsResourceExhausted(c3.status()));
  EXPECT_THAT(c3.status().message(), HasSubstr("--http-max-connections-per-client"));
  EXPECT_TRUE(table.Admit(s4.server(), "10.0.0.2").ok());
  EXPECT_FALSE(s1.ShutDown() || s2.ShutDown()) << "a refusal shuts nothing down";
}

TEST(ConnectionTableTest, WhenFullTheConnectionWaitingLongestMakesRoom) {
  ConnectionTable table(Connections(3, 3));
  SocketPair oldest, busy, newer, next;
  auto a = table.Admit(oldest.server(), "10.0.0.1");
  auto b = table.Admit(busy.server(), "10.0.0.2");
  absl::SleepFor(absl::Milliseconds(2));
  auto c = table.Admit(newer.server(), "10.0.0.3");
  b->MarkBusy();
  auto d = table.Admit(next.server(), "10.0.0.4");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_TRUE(oldest.ShutDown());
  EXPECT_FALSE(busy.ShutDown() || newer.ShutDown());
  EXPECT_EQ(table.open(), 3);
  EXPECT_EQ(table.open_from("10.0.0.1"), 0);
  a = ConnectionTable::Admission();  // the evicted one's thread lets go: counted once only
  EXPECT_EQ(table.open(), 3);
}

TEST(ConnectionTableTest, WhenFullAndEveryConnectionIsBusyTheNewOneIsRefused) {
  ConnectionTable table(Connections(2, 2));
  SocketPair s1, s2, s3;
  auto a = table.Admit(s1.server(), "10.0.0.1");
  auto b = table.Admit(s2.server(), "10.0.0.2");
  a->MarkBusy();
  b->MarkBusy();
  const auto c = table.Admit(s3.server(), "10.0.0.3");
  ASSERT_TRUE(absl::IsResourceExhausted(c.status()));
  EXPECT_THAT(c.status().message(), HasSubstr("--http-max-connections"));
  b->MarkWaiting();
  EXPECT_TRUE(table.Admit(s3.server(), "10.0.0.3").ok());
  EXPECT_TRUE(s2.ShutDown());
}

TEST(ConnectionTableTest, StoppingShutsDownTheWaitingOnesOnly) {
  ConnectionTable table(Connections(4, 4));
  SocketPair waiting, busy;
  auto a = table.Admit(waiting.server(), "10.0.0.1");
  auto b = table.Admit(busy.server(), "10.0.0.1");
  b->MarkBusy();
  table.ShutDownWaiting();
  EXPECT_TRUE(waiting.ShutDown());
  EXPECT_FALSE(busy.ShutDown());
}

httplib::Headers Headers(std::initializer_list<std::pair<const char*, const char*>> pairs) {
  httplib::Headers headers;
  for (const auto& [name, value] : pairs) headers.emplace(name, value);
  return headers;
}

TEST(FramingTest, ReadsTheFramingTheHeadersAnnounce) {
  EXPECT_EQ(FramingOf({})->kind, BodyFraming::Kind::kNone);
  const auto length = FramingOf(Headers({{"Content-Length", " 42 "}}));
  ASSERT_TRUE(length.ok());
  EXPECT_EQ(length->kind, BodyFraming::Kind::kLength);
  EXPECT_EQ(length->length, 42u);
  EXPECT_EQ(FramingOf(Headers({{"transfer-encoding", "Chunked"}}))->kind,
            BodyFraming::Kind::kChunked);
}

TEST(FramingTest, RefusesWhatHttplibWouldReadOtherwiseThanItsSenderMeant) {
  for (const auto& headers :
       {Headers({{"Content-Length", "10"}, {"Transfer-Encoding", "chunked"}}),
        Headers({{"Content-Length", "10"}, {"Content-Length", "20"}}),
        Headers({{"Content-Length", "-1"}}), Headers({{"Content-Length", "1e3"}}),
        Headers({{"Content-Length", "99999999999999999999"}})}) {
    EXPECT_TRUE(absl::IsInvalidArgument(FramingOf(headers).status()));
  }
  for (const char* coding : {"gzip, chunked", "identity", "gzip"}) {
    EXPECT_TRUE(absl::IsUnimplemented(FramingOf(Headers({{"Transfer-Encoding", coding}})).status()))
        << coding;
  }
}

TEST(EdgeLimitsTest, ValuesOutOfRangeAreRefusedNamingTheirFlag) {
  HttpLimits http;
  EXPECT_TRUE(http.Validate().ok());
  http.max_connections_per_client = http.max_connections + 1;
  EXPECT_THAT(http.Validate().message(), HasSubstr("--http-max-connections-per-client"));
  http = HttpLimits{};
  http.header_timeout = absl::ZeroDuration();
  EXPECT_THAT(http.Validate().message(), HasSubstr("--http-header-timeout"));
  http = HttpLimits{};
  http.body_min_rate = 0;
  EXPECT_THAT(http.Validate().message(), HasSubstr("--http-body-min-rate"));
  StreamLimits streams;
  EXPECT_TRUE(streams.Validate().ok());
  streams.max_streams_per_tenant = streams.max_streams + 1;
  EXPECT_THAT(streams.Validate().message(), HasSubstr("--http-max-streams-per-tenant"));
  GrpcLimits grpc;
  EXPECT_TRUE(grpc.Validate().ok());
  grpc.max_streams_per_connection = 0;
  EXPECT_THAT(grpc.Validate().message(), HasSubstr("--grpc-max-streams-per-connection"));
}

TEST(EdgeLimitsTest, EveryLimitIsAFlagWithItsDefaultInTheHelp) {
  HttpLimits http;
  GrpcLimits grpc;
  StreamLimits streams;
  Flags flags("prog", "A test server.");
  http.Register(flags);
  grpc.Register(flags);
  streams.Register(flags);
  const std::string usage = flags.Usage();
  for (const char* line :
       {"--http-max-connections  [$GRADHUB_HTTP_MAX_CONNECTIONS]", "(default 512)",
        "--http-max-connections-per-client", "--http-header-timeout", "(default 10s)",
        "--http-body-timeout", "--http-body-min-rate", "(default 8192)", "--http-max-streams",
        "--http-max-streams-per-tenant", "--grpc-max-streams-per-connection", "--grpc-max-threads",
        "--grpc-handshake-timeout"}) {
    EXPECT_THAT(usage, HasSubstr(line));
  }
}

}  // namespace
}  // namespace gradhub
