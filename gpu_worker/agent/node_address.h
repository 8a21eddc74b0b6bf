// The address a node advertises to its peers, and the interface its ranks' collectives use.
//
// Ranks of one job on different nodes connect to each other directly (Gloo, NCCL, torch's
// TCPStore at MASTER_ADDR), each at the address its node advertises (Node.address). Picking it:
//  1. `--address` given: that address, except a loopback one while gradhub-api is not on this
//     machine (its peers would connect to themselves): refused at start, naming the flag.
//  2. Otherwise the source address of this machine's route to gradhub-api: the interface that
//     reaches the control plane is the one the cluster's network is on. With the api on
//     loopback (one machine) that is 127.0.0.1, which is right there. The machine's hostname
//     is never used: Debian resolves it to 127.0.1.1.
//  3. The interface holding that address (getifaddrs) is what ranks bind their collectives
//     to: GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME, unless the operator set them in the
//     agent's environment (the ranks then inherit the operator's), and the trainer's
//     GRADHUB_LISTEN_ADDRESS (what its Gloo listens on and tells its peers).
#pragma once

#include <map>
#include <string>

#include "absl/status/statusor.h"

namespace gradhub::agent {

// 127.0.0.0/8 or ::1 (an IP literal; a name is not resolved here).
bool IsLoopbackAddress(const std::string& address);

// The host part of a gRPC target: "h:7070" -> "h", "[::1]:7070" -> "::1", "dns:///h:7070" -> "h",
// "unix:/path" -> "" (a local socket).
std::string TargetHost(const std::string& target);

// Rule 1/2 as a pure function: `flag` is --address ("" = not given), `api_is_local` whether
// gradhub-api's host is this machine (a loopback address or a local socket), `route_source`
// the source address of the route to the api (rule 2; "" when none could be found).
absl::StatusOr<std::string> ChooseAdvertisedAddress(const std::string& flag, bool api_is_local,
                                                    const std::string& route_source);

// The source address the kernel would use to reach `host` (an address or a name, resolved
// here; the first address that routes): a UDP socket connected to it sends nothing.
absl::StatusOr<std::string> RouteSourceAddress(const std::string& host);

// Whether `host` (a name or an address) resolves only to loopback addresses; "" (a local
// socket) counts as local.
bool ResolvesToLoopback(const std::string& host);

// The name of the interface holding `address` ("lo" for 127.0.0.1); "" when none does (the
// operator gave a name, or an address of another machine).
std::string InterfaceOf(const std::string& address);

// The rendezvous store address ranks get (RankAssignment.store_address, the api's
// --store-address): as given, except a loopback host while the api is reached at another
// host (`api_target`, the agent's --server), which becomes that host: an api that did not set
// --store-address says 127.0.0.1, right on one machine only.
// A list (every replica's store, services/common/api_targets.h) is taken entry by entry: entry
// i's loopback host becomes the host of `api_target`'s entry i, or of its first when it has
// fewer.
std::string StoreAddressForRanks(const std::string& store_address, const std::string& api_target);

// Rule 3 as a pure function: the variables the agent adds to a rank's environment, given the
// advertised address, its interface ("" = unknown) and the agent's own environment
// (`operator_env`, what the operator set).
std::map<std::string, std::string> RankNetworkEnvironment(
    const std::string& address, const std::string& interface,
    const std::map<std::string, std::string>& operator_env);

}  // namespace gradhub::agent
