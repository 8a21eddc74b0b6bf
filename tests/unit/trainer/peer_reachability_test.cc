#include "gpu_worker/trainer/peer_reachability.h"

#include <gtest/gtest.h>

#include <chrono>

#include "gpu_worker/ddp/store/in_memory_store.h"

namespace gradhub::trainer {
namespace {

using std::chrono::milliseconds;

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
  // TEST-NET-2 (RFC 5737): routed nowhere, so a connect there is never answered.
  store->Set("reach/1", "nodes/b 198.51.100.7 9");
  store->Set("reach/2", "nodes/b 198.51.100.7 10");
  auto rank3 = PeerReachability::Publish(store, 3, "nodes/c", "127.0.0.1");
  store->Set("reach/4", "nodes/c 198.51.100.7 11");
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(rank0->UnreachableNodes(5, milliseconds(500)), std::vector<std::string>{"nodes/b"});
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(1500));
}

// Step 3: ranks on the prober's own node never count; a peer that never published is skipped.
TEST(PeerReachabilityTest, ItsOwnNodeAndSilentPublishersAreLeftOut) {
  auto store = std::make_shared<ddp::InMemoryStore>();
  auto rank0 = PeerReachability::Publish(store, 0, "nodes/a", "127.0.0.1");
  store->Set("reach/1", "nodes/a 198.51.100.7 9");
  EXPECT_TRUE(rank0->UnreachableNodes(3, milliseconds(300)).empty());
}

}  // namespace
}  // namespace gradhub::trainer
