// PacketFilter on loopback listeners of this namespace: a dropped port is silence (a connect
// times out, never refused), lifting restores it, filters are independent, and nothing is left
// behind in nftables.
#include "tests/support/packet_filter.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <string>

#include "tests/support/subprocess.h"

namespace gradhub::testing {
namespace {

// A TCP listener on `address`, port chosen by the kernel. Connections are accepted only when a
// test asks: the kernel completes their handshakes into the backlog, which is all a connect
// needs.
class Listener {
 public:
  explicit Listener(const std::string& address) : address_(address) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    inet_pton(AF_INET, address.c_str(), &addr.sin_addr);
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0) << errno;
    EXPECT_EQ(listen(fd_, 64), 0);
    socklen_t len = sizeof(addr);
    getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
  }
  ~Listener() { close(fd_); }
  int Accept() { return accept(fd_, nullptr, nullptr); }
  const std::string& address() const { return address_; }
  int port() const { return port_; }

 private:
  std::string address_;
  int fd_ = -1;
  int port_ = 0;
};

enum class Outcome { kConnected, kRefused, kTimedOut, kOther };

std::string Name(Outcome outcome) {
  switch (outcome) {
    case Outcome::kConnected:
      return "connected";
    case Outcome::kRefused:
      return "refused";
    case Outcome::kTimedOut:
      return "timed out";
    case Outcome::kOther:
      break;
  }
  return "other error";
}

// A non-blocking connect to the listener, given `wait_ms` to complete.
Outcome Connect(const Listener& to, int wait_ms = 500) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(to.port());
  inet_pton(AF_INET, to.address().c_str(), &addr.sin_addr);
  Outcome outcome = Outcome::kOther;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    outcome = Outcome::kConnected;
  } else if (errno == EINPROGRESS) {
    pollfd entry{fd, POLLOUT, 0};
    if (poll(&entry, 1, wait_ms) == 0) {
      outcome = Outcome::kTimedOut;
    } else {
      int error = 0;
      socklen_t len = sizeof(error);
      getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &len);
      outcome = error == 0              ? Outcome::kConnected
                : error == ECONNREFUSED ? Outcome::kRefused
                                        : Outcome::kOther;
    }
  } else if (errno == ECONNREFUSED) {
    outcome = Outcome::kRefused;
  }
  close(fd);
  return outcome;
}

// The nftables tables this process owns now (PacketFilter names them gradhub_test_<pid>_N).
int OwnTables() {
  const RunResult listed = Run({"/bin/sh", "-c", "PATH=$PATH:/usr/sbin:/sbin nft list tables"});
  EXPECT_EQ(listed.exit_code, 0) << listed.err;
  const std::string own = "gradhub_test_" + std::to_string(getpid()) + "_";
  int count = 0;
  for (size_t at = listed.out.find(own); at != std::string::npos;
       at = listed.out.find(own, at + 1)) {
    ++count;
  }
  return count;
}

class PacketFilterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!PacketFilter::Available(&why)) GTEST_SKIP() << why;
  }
};

TEST_F(PacketFilterTest, ADroppedPortIsSilenceUntilLifted) {
  Listener listener("127.0.0.1");
  ASSERT_EQ(Name(Connect(listener)), Name(Outcome::kConnected));
  PacketFilter filter;
  const int rule = filter.DropTcpPort(listener.port());
  EXPECT_EQ(Name(Connect(listener)), Name(Outcome::kTimedOut)) << "dropped, not refused";
  filter.Lift(rule);
  EXPECT_EQ(Name(Connect(listener)), Name(Outcome::kConnected));
  filter.Lift(rule);  // a second Lift of the same rule does nothing
}

// On a connection already open, a drop is a dead link: what is sent meanwhile does not arrive,
// and arrives once the rule is lifted (TCP retransmits it), with no reset on either side.
TEST_F(PacketFilterTest, AnOpenConnectionSeesSilenceThenCarriesOn) {
  Listener listener("127.0.0.1");
  const int client = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(listener.port());
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  ASSERT_EQ(connect(client, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0) << errno;
  const int server = listener.Accept();
  ASSERT_GE(server, 0);
  auto arrives_within = [&](int ms) {
    pollfd entry{server, POLLIN, 0};
    if (poll(&entry, 1, ms) != 1) return std::string();
    char buffer[16];
    const ssize_t n = read(server, buffer, sizeof(buffer));
    return n > 0 ? std::string(buffer, n) : std::string("<eof>");
  };
  ASSERT_EQ(write(client, "a", 1), 1);
  EXPECT_EQ(arrives_within(1000), "a");
  {
    PacketFilter filter;
    filter.DropTcpPort(listener.port());
    ASSERT_EQ(write(client, "b", 1), 1);
    EXPECT_EQ(arrives_within(500), "") << "went through a dropped port";
  }
  EXPECT_EQ(arrives_within(5000), "b") << "not retransmitted once lifted";
  close(server);
  close(client);
}

TEST_F(PacketFilterTest, RulesAndFiltersAreIndependent) {
  Listener first("127.0.0.1"), second("127.0.0.1"), other_host("127.0.0.2");
  PacketFilter a, b;
  const int first_rule = a.DropTcpPort(first.port());
  b.DropTcpPort(second.port());
  const int endpoint_rule = a.DropTcpEndpoint("127.0.0.2", other_host.port());
  EXPECT_EQ(Name(Connect(first)), Name(Outcome::kTimedOut));
  EXPECT_EQ(Name(Connect(second)), Name(Outcome::kTimedOut));
  EXPECT_EQ(Name(Connect(other_host)), Name(Outcome::kTimedOut));
  // One rule lifted, the filter's other rule stays.
  a.Lift(first_rule);
  EXPECT_EQ(Name(Connect(first)), Name(Outcome::kConnected));
  EXPECT_EQ(Name(Connect(other_host)), Name(Outcome::kTimedOut));
  a.Lift(endpoint_rule);
  EXPECT_EQ(Name(Connect(other_host)), Name(Outcome::kConnected));
  // Filter a's rules never touched filter b's.
  EXPECT_EQ(Name(Connect(second)), Name(Outcome::kTimedOut));
  b.LiftAll();
  EXPECT_EQ(Name(Connect(second)), Name(Outcome::kConnected));
}

TEST_F(PacketFilterTest, AnAddressIsDroppedWhateverThePort) {
  Listener on_two("127.0.0.2"), on_one("127.0.0.1");
  PacketFilter filter;
  filter.DropAddress("127.0.0.2");
  EXPECT_EQ(Name(Connect(on_two)), Name(Outcome::kTimedOut));
  EXPECT_EQ(Name(Connect(on_one)), Name(Outcome::kConnected));
  filter.LiftAll();
  EXPECT_EQ(Name(Connect(on_two)), Name(Outcome::kConnected));
}

TEST_F(PacketFilterTest, TheDestructorLiftsEverythingAndLeavesNoTable) {
  Listener listener("127.0.0.1");
  const int before = OwnTables();
  {
    PacketFilter filter;
    filter.DropTcpPort(listener.port());
    EXPECT_EQ(OwnTables(), before + 1);
    EXPECT_EQ(Name(Connect(listener)), Name(Outcome::kTimedOut));
  }
  EXPECT_EQ(OwnTables(), before);
  EXPECT_EQ(Name(Connect(listener)), Name(Outcome::kConnected));
}

TEST_F(PacketFilterTest, RefusesWhatIsNotAnAddressOrAPort) {
  PacketFilter filter;
  EXPECT_THROW(filter.DropAddress("10.0.0.1; flush ruleset"), std::invalid_argument);
  EXPECT_THROW(filter.DropTcpPort(0), std::invalid_argument);
  EXPECT_THROW(filter.DropTcpEndpoint("::1", 80), std::invalid_argument);
  EXPECT_THROW(filter.Lift(7), std::invalid_argument);
}

}  // namespace
}  // namespace gradhub::testing
