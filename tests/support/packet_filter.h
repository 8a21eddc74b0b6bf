// Network faults for end-to-end tests: packets dropped by nftables rules, as a partition or a
// dead link would drop them (the peer sees silence, never a reset). Each PacketFilter owns one
// nftables table of its own, in this process's network namespace or a named one
// (/run/netns/NAME), so that tests running at once never touch each other's rules, and removes
// it when destroyed.
//
// This kernel has no netem: packets can be dropped and links capped (tc, network_hosts.h), but
// not delayed or lost at random.
#pragma once

#include <string>
#include <vector>

namespace gradhub::testing {

class PacketFilter {
 public:
  // Whether rules can be made here (root, the nft program, nf_tables in the kernel); when not,
  // `why` says which is missing, for GTEST_SKIP.
  static bool Available(std::string* why);

  // `netns` = "" for this process's namespace, else the name of one under /run/netns.
  explicit PacketFilter(std::string netns = "");
  ~PacketFilter();  // deletes the table, lifting every rule
  PacketFilter(const PacketFilter&) = delete;
  PacketFilter& operator=(const PacketFilter&) = delete;

  // Each call adds a rule and returns its handle for Lift. A rule drops packets in both
  // directions (input and output hooks), so both ends of a connection see silence.
  // Every packet to or from `address` (IPv4).
  int DropAddress(const std::string& address);
  // TCP packets to or from `port` (either the destination or the source port), any address,
  // loopback included.
  int DropTcpPort(int port);
  // TCP packets between this namespace and `address`:`port`.
  int DropTcpEndpoint(const std::string& address, int port);
  // Removes one rule; the others stay.
  void Lift(int handle);
  // Removes every rule.
  void LiftAll();

 private:
  std::string netns_;
  std::string table_;
  // handle -> the nftables rule handles it added
  std::vector<std::vector<int>> rules_;
};

}  // namespace gradhub::testing
