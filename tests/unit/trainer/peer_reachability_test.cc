#include "gpu_worker/trainer/peer_reachability.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <vector>

#include "gpu_worker/ddp/store/in_memory_store.h"

namespace gradhub::trainer {
namespace {

using std::chrono::milliseconds;

// A port on 127.0.0.1 where a connect is never answered: a listener whose accept queue is full
// (backlog 0, filled and never accepted) makes the kernel drop further handshakes, as a
// partition drops them. Its sockets stay open for the test's life.
class SilentPort {
 public:
  SilentPort() {
    listener_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof(address);
    bind(listener_, reinterpret_cast<sockaddr*>(&address), length);
    listen(listener_, 0);
    getsockname(listener_, reinterpret_cast<sockaddr*>(&address), &length);
    port_ = ntohs(address.sin_port);
    for (int i = 0; i < 3; ++i) {  // fill the queue
      const int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
      connect(fd, reinterpret_cast<sockaddr*>(&address), length);
      fillers_.push_back(fd);
    }
    usleep(100 * 1000);  // the fillers' handshakes complete
  }
  ~SilentPort() {
    for (int fd : fillers_) close(fd);
    close(listener_);
  }
  int port() const { return port_; }

 private:
  int listener_ = -1;
  int port_ = 0;
  std::vector<int> fillers_;
};

// Step 1: what a rank publishes is where it listens.
TEST(PeerReachabilityTest, PublishesItsNodeAddressAndAListeningPort) {
  auto store = std::make_shared<ddp::InMemoryStore>();
  auto probe = PeerReachability::Publish(store, 1, "nodes/b", "127.0.0.1");
  ASSERT_NE(probe, nullptr);
  const std::string value = store->Get("reach/1", milliseconds(100));
  EXPECT_EQ(value.rfind("nodes/b 127.0.0.1 ", 0), 0u) << value;
}

// Without a listen address (a trainer run by hand), nothing is published.
TEST(PeerReachabilityTest, NoListenAddressPublishesNothing) {
  auto store = std::make_shared<ddp::InMemoryStore>();
  EXPECT_EQ(PeerReachability::Publish(store, 0, "nodes/a", ""), nullptr);
  EXPECT_FALSE(store->Check({"reach/0"}));
}

// Step 2: a peer whose socket answers, or whose host refuses (its process is gone), is
// reachable.
TEST(PeerReachabilityTest, APeerThatAnswersOrRefusesIsReachable) {
  auto store = std::make_shared<ddp::InMemoryStore>();
  auto rank0 = PeerReachability::Publish(store, 0, "nodes/a", "127.0.0.1");
  auto rank1 = PeerReachability::Publish(store, 1, "nodes/b", "127.0.0.1");
  ASSERT_NE(rank0, nullptr);
  ASSERT_NE(rank1, nullptr);
  EXPECT_TRUE(rank0->UnreachableNodes(2, milliseconds(2000)).empty());
  rank1.reset();  // its port now refuses
  EXPECT_TRUE(rank0->UnreachableNodes(2, milliseconds(2000)).empty());
}

// Steps 2 and 3: silence (an address nothing answers for) makes a node unreachable once none
// of its ranks answered; the probe takes at most its timeout; a node with one rank that
// answers is reachable.
TEST(PeerReachabilityTest, ANodeNoneOfWhoseRanksAnswersIsUnreachable) {
  auto store = std::make_shared<ddp::InMemoryStore>();
  auto rank0 = PeerReachability::Publish(store, 0, "nodes/a", "127.0.0.1");
  ASSERT_NE(rank0, nullptr);
  const SilentPort silent;
  const std::string silence = "127.0.0.1 " + std::to_string(silent.port());
  store->Set("reach/1", "nodes/b " + silence);
  store->Set("reach/2", "nodes/b " + silence);
  auto rank3 = PeerReachability::Publish(store, 3, "nodes/c", "127.0.0.1");
  store->Set("reach/4", "nodes/c " + silence);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(rank0->UnreachableNodes(5, milliseconds(500)), std::vector<std::string>{"nodes/b"});
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(1500));
}

// Step 3: ranks on the prober's own node never count; a peer that never published is skipped.
TEST(PeerReachabilityTest, ItsOwnNodeAndSilentPublishersAreLeftOut) {
  auto store = std::make_shared<ddp::InMemoryStore>();
  auto rank0 = PeerReachability::Publish(store, 0, "nodes/a", "127.0.0.1");
  const SilentPort silent;
  store->Set("reach/1", "nodes/a 127.0.0.1 " + std::to_string(silent.port()));
  EXPECT_TRUE(rank0->UnreachableNodes(3, milliseconds(300)).empty());
}

}  // namespace
}  // namespace gradhub::trainer
