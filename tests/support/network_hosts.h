// Hosts for end-to-end tests: each a network namespace of its own, all on one bridge, so that
// processes on different hosts talk over real interfaces and real TCP, never loopback, and the
// links between them can fail or be slow.
//
//   this process's namespace: the hub, 10.X.Y.1 on gh<id>hub: PostgreSQL, gradhub-api,
//   gradhub-checkpoint and gradhub-metrics listen there, and the test talks to them
//        | veth
//   namespace gh<id>-sw, the switch: bridge gh<id>br --- veth --- host "a": eth0 10.X.Y.10, lo
//                                                    --- veth --- host "b": eth0 10.X.Y.11, lo
//                                                    ...
//
// Set-up (the constructor), in steps:
//  1. A free /24 in 10.64.0.0/10 (none of this machine's routes overlaps it) and an id from
//     this process's pid, so that tests running at once never share names or addresses.
//  2. The switch: a namespace holding only the bridge. Bridged packets pass the iptables FORWARD
//     chain of the bridge's namespace when br_netfilter is loaded, and Docker sets this
//     machine's to DROP: in a namespace of its own the bridge meets no firewall but its own,
//     which is empty, and this machine's firewall is never touched.
//  3. The hub's veth: its outer end in this process's namespace with the hub's address, its
//     inner end a port of the bridge.
//  4. Per host a namespace gh<id>-<host> and a veth pair: one end a port of the bridge, the
//     other eth0 in the host's namespace (with lo up and a default route via the hub).
//  5. Every step is a command (ip, tc) whose failure throws with its output; whatever was made
//     is removed again by the destructor, which also runs when the constructor throws.
//
// Link controls: a partition between two hosts, or a host cut off from the hub (all of it or
// one port), as nftables drop rules in the host's namespace (packet_filter.h: packets vanish,
// connections hang as on a real partition); bandwidth caps as tc tbf on both ends of a host's
// link. This kernel has no netem: no delay or random loss can be emulated.
//
// Processes run on a host through Command(): nsenter into its namespace, optionally with
// /etc/hosts replaced for them (a hostname that resolves to 127.0.1.1, Debian's default).
// Needs root; Available() says why not, for GTEST_SKIP.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tests/support/packet_filter.h"

namespace gradhub::testing {

class NetworkHosts {
 public:
  // Root, ip, nsenter, unshare, nft, and a namespace that can be made; else `why`.
  static bool Available(std::string* why);

  // Makes a host per name (names: [a-z0-9], at most 4 characters).
  explicit NetworkHosts(const std::vector<std::string>& hosts);
  ~NetworkHosts();
  NetworkHosts(const NetworkHosts&) = delete;
  NetworkHosts& operator=(const NetworkHosts&) = delete;

  // The hub's address (this process's namespace, its veth to the switch).
  const std::string& hub_address() const { return hub_address_; }
  std::string address(const std::string& host) const;
  // The namespace's name, under /run/netns.
  std::string netns(const std::string& host) const;

  struct CommandOptions {
    // Bind-mount a hosts file mapping this machine's hostname to 127.0.1.1 over /etc/hosts,
    // for the process only (a mount namespace of its own), as on a stock Debian machine.
    bool hostname_resolves_to_loopback = false;
  };
  // `argv` as run on `host`: the same pid (nsenter and unshare exec, never fork), so the
  // process can be signalled and waited for as if started directly.
  std::vector<std::string> Command(const std::string& host, std::vector<std::string> argv,
                                   CommandOptions options) const;
  std::vector<std::string> Command(const std::string& host, std::vector<std::string> argv) const {
    return Command(host, std::move(argv), CommandOptions{});
  }

  // Drops every packet between hosts `a` and `b` (both directions, rules on both hosts);
  // Heal lifts exactly that partition.
  void Partition(const std::string& a, const std::string& b);
  void Heal(const std::string& a, const std::string& b);
  // The packet filter of `host`'s namespace, for finer cuts (one port of the hub, say).
  PacketFilter& filter(const std::string& host);

  // Bytes that crossed `host`'s link so far, both ways (the bridge end's counters).
  int64_t LinkBytes(const std::string& host) const;

  // Caps `host`'s link at `bits_per_second` each way (tc tbf on both veth ends); 0 lifts it.
  void CapBandwidth(const std::string& host, int64_t bits_per_second);

 private:
  struct Host {
    // outer_link: the bridge's port, in the switch's namespace.
    std::string name, netns, outer_link, address;
    std::unique_ptr<PacketFilter> filter;
  };
  void AddHost(const std::string& name, int index);
  void TearDown();  // idempotent
  const Host& host(const std::string& name) const;
  Host& host(const std::string& name);

  std::string id_, switch_netns_, bridge_, hub_link_, prefix_, hub_address_;
  std::string hosts_file_;  // for CommandOptions::hostname_resolves_to_loopback
  std::vector<Host> hosts_;
  // Partition(a, b) -> the rule handles in a's and b's filters.
  std::map<std::pair<std::string, std::string>, std::pair<int, int>> partitions_;
};

}  // namespace gradhub::testing
