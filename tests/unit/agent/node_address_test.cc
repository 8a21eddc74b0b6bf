#include "gpu_worker/agent/node_address.h"

#include <gtest/gtest.h>

namespace gradhub::agent {
namespace {

TEST(NodeAddressTest, LoopbackAddressesAreTheWhole127NetAndV6One) {
  EXPECT_TRUE(IsLoopbackAddress("127.0.0.1"));
  EXPECT_TRUE(IsLoopbackAddress("127.0.1.1"));  // Debian's address of the hostname
  EXPECT_TRUE(IsLoopbackAddress("::1"));
  EXPECT_FALSE(IsLoopbackAddress("10.1.2.3"));
  EXPECT_FALSE(IsLoopbackAddress("fe80::1"));
  EXPECT_FALSE(IsLoopbackAddress("localhost"));  // a name: not resolved by this rule
}

TEST(NodeAddressTest, TargetHostStripsPortSchemeAndBrackets) {
  EXPECT_EQ(TargetHost("api.example:7070"), "api.example");
  EXPECT_EQ(TargetHost("10.0.0.1:7070"), "10.0.0.1");
  EXPECT_EQ(TargetHost("[::1]:7070"), "::1");
  EXPECT_EQ(TargetHost("dns:///api:7070"), "api");
  EXPECT_EQ(TargetHost("ipv4:10.0.0.2:7070"), "10.0.0.2");
  EXPECT_EQ(TargetHost("unix:/run/gradhub.sock"), "");
  EXPECT_EQ(TargetHost("api"), "api");
}

// Rule 1: the flag as given.
TEST(NodeAddressTest, Rule1AGivenAddressIsUsed) {
  EXPECT_EQ(*ChooseAdvertisedAddress("10.0.0.7", false, "10.0.0.9"), "10.0.0.7");
  EXPECT_EQ(*ChooseAdvertisedAddress("node7.example", false, ""), "node7.example");
}

// Rule 1: its peers would connect to themselves.
TEST(NodeAddressTest, Rule1ALoopbackFlagIsRefusedWhenTheApiIsRemote) {
  const auto chosen = ChooseAdvertisedAddress("127.0.1.1", false, "10.0.0.9");
  ASSERT_FALSE(chosen.ok());
  EXPECT_EQ(chosen.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(chosen.status().message().find("--address: 127.0.1.1 is a loopback address"),
            std::string::npos)
      << chosen.status();
}

TEST(NodeAddressTest, Rule1ALoopbackFlagIsFineWithTheApiOnThisMachine) {
  EXPECT_EQ(*ChooseAdvertisedAddress("127.0.0.1", true, "127.0.0.1"), "127.0.0.1");
}

// Rule 2: the route's source address, never the hostname's.
TEST(NodeAddressTest, Rule2WithoutTheFlagTheRoutesSourceIsAdvertised) {
  EXPECT_EQ(*ChooseAdvertisedAddress("", false, "10.0.0.9"), "10.0.0.9");
  EXPECT_EQ(*ChooseAdvertisedAddress("", true, "127.0.0.1"), "127.0.0.1");
  const auto none = ChooseAdvertisedAddress("", false, "");
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("give --address"), std::string::npos);
}

TEST(NodeAddressTest, Rule2TheRouteToLoopbackLeavesFromLoopback) {
  const auto source = RouteSourceAddress("127.0.0.1");
  ASSERT_TRUE(source.ok()) << source.status();
  EXPECT_EQ(*source, "127.0.0.1");
  EXPECT_EQ(InterfaceOf("127.0.0.1"), "lo");
  EXPECT_EQ(InterfaceOf("192.0.2.254"), "");  // TEST-NET-1: on no interface here
  EXPECT_TRUE(ResolvesToLoopback("127.0.0.1"));
  EXPECT_TRUE(ResolvesToLoopback(""));
  EXPECT_FALSE(ResolvesToLoopback("10.1.2.3"));
}

TEST(NodeAddressTest, ALoopbackStoreAddressBecomesTheApisHostWhenTheApiIsRemote) {
  EXPECT_EQ(StoreAddressForRanks("127.0.0.1:7070", "10.0.0.1:7070"), "10.0.0.1:7070");
  EXPECT_EQ(StoreAddressForRanks("127.0.0.1:7071", "api.example:7070"), "api.example:7071");
  EXPECT_EQ(StoreAddressForRanks("[::1]:7070", "[fd00::1]:7070"), "[fd00::1]:7070");
  // As given: an address of its own, or an api on this machine.
  EXPECT_EQ(StoreAddressForRanks("store.example:7070", "10.0.0.1:7070"), "store.example:7070");
  EXPECT_EQ(StoreAddressForRanks("127.0.0.1:7070", "127.0.0.1:7070"), "127.0.0.1:7070");
  EXPECT_EQ(StoreAddressForRanks("127.0.0.1:7070", "localhost:7070"), "127.0.0.1:7070");
  EXPECT_EQ(StoreAddressForRanks("", "10.0.0.1:7070"), "");
}

// Every replica's store (services/common/api_targets.h): entry by entry.
TEST(NodeAddressTest, AStoreListBecomesTheApiHostsEntryByEntry) {
  EXPECT_EQ(StoreAddressForRanks("127.0.0.1:7070,127.0.0.1:7080", "10.0.0.1:7070,10.0.0.2:7080"),
            "10.0.0.1:7070,10.0.0.2:7080");
  // Fewer api entries: the first one's host.
  EXPECT_EQ(StoreAddressForRanks("127.0.0.1:7070,[::1]:7080", "api.example:7070"),
            "api.example:7070,api.example:7080");
  EXPECT_EQ(StoreAddressForRanks("s1:7070,127.0.0.1:7080", "10.0.0.1:7070,10.0.0.2:7080"),
            "s1:7070,10.0.0.2:7080");
  EXPECT_EQ(StoreAddressForRanks("127.0.0.1:7070,127.0.0.1:7080", "127.0.0.1:7070,127.0.0.1:7080"),
            "127.0.0.1:7070,127.0.0.1:7080");
  EXPECT_EQ(StoreAddressForRanks("ipv4:127.0.0.1:1,127.0.0.1:2", "10.0.0.1:7070"),
            "ipv4:127.0.0.1:1,127.0.0.1:2");
  EXPECT_EQ(TargetHost("10.0.0.1:7070,10.0.0.2:7070"), "10.0.0.1");
}

// Rule 3: the address's interface for Gloo and NCCL.
TEST(NodeAddressTest, Rule3RanksListenOnTheAddressAndItsInterface) {
  const auto env = RankNetworkEnvironment("10.0.0.9", "eth1", {});
  EXPECT_EQ(env.at("GRADHUB_LISTEN_ADDRESS"), "10.0.0.9");
  EXPECT_EQ(env.at("GLOO_SOCKET_IFNAME"), "eth1");
  EXPECT_EQ(env.at("NCCL_SOCKET_IFNAME"), "eth1");
}

// Rule 3: the operator's interfaces win (ranks inherit them from the agent's environment).
TEST(NodeAddressTest, Rule3TheOperatorsInterfacesAreLeftAlone) {
  const auto gloo = RankNetworkEnvironment("10.0.0.9", "eth1", {{"GLOO_SOCKET_IFNAME", "ib0"}});
  EXPECT_EQ(gloo.count("GLOO_SOCKET_IFNAME"), 0u);
  EXPECT_EQ(gloo.count("GRADHUB_LISTEN_ADDRESS"), 0u);  // the trainer listens on ib0 then
  EXPECT_EQ(gloo.at("NCCL_SOCKET_IFNAME"), "eth1");
  const auto nccl = RankNetworkEnvironment("10.0.0.9", "eth1", {{"NCCL_SOCKET_IFNAME", "ib0"}});
  EXPECT_EQ(nccl.count("NCCL_SOCKET_IFNAME"), 0u);
  EXPECT_EQ(nccl.at("GLOO_SOCKET_IFNAME"), "eth1");
}

TEST(NodeAddressTest, Rule3AnUnknownInterfaceSetsOnlyTheAddress) {
  const auto env = RankNetworkEnvironment("node7.example", "", {});
  EXPECT_EQ(env.at("GRADHUB_LISTEN_ADDRESS"), "node7.example");
  EXPECT_EQ(env.count("GLOO_SOCKET_IFNAME"), 0u);
  EXPECT_EQ(env.count("NCCL_SOCKET_IFNAME"), 0u);
}

}  // namespace
}  // namespace gradhub::agent
