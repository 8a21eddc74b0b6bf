// The leading gradhub-api replica cut off from PostgreSQL (issue 35), as real processes: two
// replicas on one database, the leader connecting through 127.0.0.2 and every packet between
// it and PostgreSQL dropped by a packet filter (a partition: silence, never a reset). The
// leader steps down by its own clock before its lease ends (leader_lease.h step 3), the other
// replica takes over once the lease has expired, and when the partition heals the old leader
// follows the new one instead of taking its term back.
#include <gtest/gtest.h>

#include <chrono>
#include <iostream>
#include <memory>
#include <regex>
#include <string>
#include <thread>

#include "tests/support/packet_filter.h"
#include "tests/support/postgres_server.h"
#include "tests/support/subprocess.h"

namespace gradhub {
namespace {

using testing::BinaryPath;
using testing::Subprocess;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using std::chrono::seconds;

// The replicas' --leader-lease; the default, said again.
constexpr milliseconds kLease(1500);

std::unique_ptr<Subprocess> StartReplica(const std::string& url) {
  auto api = std::make_unique<Subprocess>(std::vector<std::string>{
      BinaryPath("gradhub-api"), "--database-url", url, "--grpc-address", "127.0.0.1:0",
      "--http-host", "127.0.0.1", "--http-port", "0", "--leader-lease", "1500ms",
      "--database-silence-timeout", "1s", "serve"});
  return api;
}

// When `process`'s stderr first matches `pattern` (polled every 10 ms), or nullopt after
// `timeout`.
std::optional<Clock::time_point> AwaitStderr(Subprocess& process, const std::string& pattern,
                                             Clock::duration timeout) {
  const std::regex wanted(pattern);
  const auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    if (std::regex_search(process.err(), wanted)) return Clock::now();
    std::this_thread::sleep_for(milliseconds(10));
  }
  return std::nullopt;
}

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

TEST(LeaderCutoffE2eTest, ALeaderCutOffFromPostgresStepsDownBeforeAnotherTakesOver) {
  std::string why;
  if (!testing::PacketFilter::Available(&why)) GTEST_SKIP() << why;
  const std::string url = testing::PostgresServer::Shared().CreateDatabase();
  const std::string via_second_address =
      std::regex_replace(url, std::regex("@127\\.0\\.0\\.1:"), "@127.0.0.2:");
  ASSERT_NE(via_second_address, url) << url;
  const int pg_port =
      std::stoi(std::regex_replace(url, std::regex(".*@127\\.0\\.0\\.1:([0-9]+)/.*"), "$1"));

  // The future leader first, alone, so that it takes term 1; then the other.
  std::unique_ptr<Subprocess> cut = StartReplica(via_second_address);
  ASSERT_TRUE(AwaitStderr(*cut, "leading the control plane \\(term 1,", seconds(30))) << cut->err();
  std::unique_ptr<Subprocess> other = StartReplica(url);
  std::this_thread::sleep_for(seconds(2));  // the other replica up and reading the row
  ASSERT_EQ(other->err().find("leading the control plane"), std::string::npos) << other->err();

  testing::PacketFilter filter;
  const auto partitioned = Clock::now();
  filter.DropTcpEndpoint("127.0.0.2", pg_port);
  const auto line = AwaitStderr(*cut, "no longer leading \\(term 1\\)", seconds(30));
  const auto taken_over = AwaitStderr(*other, "leading the control plane \\(term 2,", seconds(30));
  ASSERT_TRUE(line.has_value()) << cut->err();
  ASSERT_TRUE(taken_over.has_value()) << other->err();
  // The line comes at the first tick after the local expiry and says how long before that
  // the leader stopped acting.
  std::smatch ago;
  const std::string err = cut->err();
  const bool said = std::regex_search(
      err, ago, std::regex("no longer leading \\(term 1\\); stopped acting ([0-9.]+) s ago"));
  const Clock::time_point stepped_down =
      *line - (said ? std::chrono::duration_cast<Clock::duration>(
                          std::chrono::duration<double>(std::stod(ago[1].str())))
                    : Clock::duration::zero());
  std::cout << "[ measured ] partition to the leader stepping down "
            << Seconds(stepped_down - partitioned) << " s, to the other replica taking over "
            << Seconds(*taken_over - partitioned) << " s (lease " << Seconds(kLease) << " s)"
            << std::endl;
  // Its last renewal came at most a quarter lease before the cut: it must stop acting before
  // that renewal's lease ends, and before the other replica acts.
  EXPECT_LT(stepped_down - partitioned, kLease) << cut->err();
  EXPECT_LT(stepped_down, *taken_over);

  // Healed: the old leader sees the new term and follows it.
  filter.LiftAll();
  std::this_thread::sleep_for(kLease * 3);
  EXPECT_EQ(cut->err().find("leading the control plane (term 3"), std::string::npos) << cut->err();
  EXPECT_EQ(other->err().find("no longer leading (term 2)"), std::string::npos) << other->err();
  cut->Kill(SIGTERM);
  other->Kill(SIGTERM);
  EXPECT_EQ(cut->Wait(seconds(20)), 0) << cut->err();
  EXPECT_EQ(other->Wait(seconds(20)), 0) << other->err();
}

}  // namespace
}  // namespace gradhub
