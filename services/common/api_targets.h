// The gRPC channel of every client of gradhub-api (the CLI, agents, trainers' store), given one
// address or several replicas' (issue 35), so that a dead replica is left at once.
//
// A flag's value becomes a channel target:
//  1. A gRPC target with a scheme ("dns:", "ipv4:", "ipv6:", "unix:", "unix-abstract:"): as
//     given (the operator chose).
//  2. One "host:port": "dns:///host:port". gRPC's DNS resolver returns every address of the
//     name, and pick_first tries them in order: a Kubernetes headless Service or a compose
//     service name with several replicas fails over this way, and follows their addresses as
//     they change.
//  3. "host1:port1,host2:port2,...": each host resolved here, once, to every address it has,
//     into one "ipv4:a:p,b:p" (or "ipv6:") list for pick_first. Addresses that change later are
//     not followed: give one DNS name (2.) for that. With both families present, the IPv4
//     addresses are used when every entry has one, else the IPv6 ones, else IPv4 addresses
//     mapped into IPv6.
//
// TLS: the server's certificate is checked against the host as given, so in 3. against the
// first entry's host (GRPC_SSL_TARGET_NAME_OVERRIDE_ARG): every replica's certificate must name
// it. `gradhub cluster up`'s CA issues one certificate for localhost and 127.0.0.1, which every
// replica of one machine shares.
//
// Failover (FailoverChannelArguments):
//  - A replica killed (SIGKILL, crash, host reboot with a live network) resets its connections:
//    calls in flight fail UNAVAILABLE at once, the next call connects to the next address
//    (refused connections are skipped at once).
//  - A replica frozen (SIGSTOP, a hung VM) or cut off says nothing, and its kernel still
//    acknowledges: keepalive pings every 2 s, answered within 1 s, close the connection after
//    at most ~3 s, and the next address is tried (each connect given the connect timeout
//    below); with one address, the same one again.
//  - A channel whose connection closed asks its resolver again, and gRPC's DNS resolver
//    answers at most once per GRPC_ARG_DNS_MIN_TIME_BETWEEN_RESOLUTIONS_MS, 30 s by default:
//    until then every call failed with the last error. An agent whose only api was cut off for
//    5 s (many_hosts_e2e_test fault 2) got no heartbeat through for more than 3 s after the
//    link returned, in 4 of 6 runs, and its ranks were stopped at the outage grace. At 500 ms:
//    4 of 4 runs kept their attempt. (Stop 45 had turned the pings off for one address
//    instead.)
//  - Reconnect backoff is 200 ms growing to 1 s, so a replica that comes back is used again
//    soon, and pick_first stays where it is connected (no flapping back).
//  - The connect timeout (gRPC's MIN_CONNECT_TIMEOUT: TCP, TLS and HTTP/2's SETTINGS all
//    within it) is the caller's, as its clients differ:
//     - kClusterConnectTimeout, 1 s: agents and ranks, on the api's own network. A connect
//       that takes longer is a dead path: a frozen first replica is left after 1 s, and an
//       attempt begun while a link was cut (its SYN lost) is made again within 1 s of the
//       link's return instead of at TCP's next SYN retransmit, seconds later.
//     - kCommandConnectTimeout, 5 s: the CLI, which may be far away and speak TLS, and whose
//       --timeout ends the call anyway. (At 200 ms, the agents' old setting, a server that
//       accepts but never answers failed the CLI UNAVAILABLE before its deadline, and a slow
//       network could never connect.)
//
// Failure cases of parsing: an empty entry ("a:1,,b:2"), an entry without a port, a bad port,
// or a name that does not resolve: refused with the flag's name (the last one UNAVAILABLE, as
// DNS may only be missing for now).
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace gradhub {

// One "host:port" entry of a list: host without brackets ("::1"), port as text.
struct HostPort {
  std::string host;
  std::string port;
};

struct ApiTarget {
  // What grpc::CreateCustomChannel takes.
  std::string target;
  // The name the server's TLS certificate is checked against when it is not the target's own
  // host (rule 3); "" = the target's.
  std::string tls_name;
  // Each entry's host as given, in order ("" for a local socket).
  std::vector<std::string> hosts;
};

// Splits and checks `value` (rules 1-3, nothing resolved); `flag` names it in errors ("--server").
absl::StatusOr<std::vector<HostPort>> SplitApiAddresses(const std::string& flag,
                                                        const std::string& value);

// The channel target of `value` (rules 1-3; rule 3 resolves the hosts).
absl::StatusOr<ApiTarget> ParseApiTarget(const std::string& flag, const std::string& value);

inline constexpr std::chrono::milliseconds kClusterConnectTimeout{1000};
inline constexpr std::chrono::milliseconds kCommandConnectTimeout{5000};

// `base` plus the failover settings above (pick_first, backoff, `connect_timeout`, keepalive,
// the TLS name).
grpc::ChannelArguments FailoverChannelArguments(const ApiTarget& target,
                                                std::chrono::milliseconds connect_timeout,
                                                grpc::ChannelArguments base = {});

std::shared_ptr<grpc::Channel> CreateApiChannel(
    const ApiTarget& target, const std::shared_ptr<grpc::ChannelCredentials>& credentials,
    std::chrono::milliseconds connect_timeout, grpc::ChannelArguments base = {});

// The first host of `value` (a target or a list, as ParseApiTarget takes), for what needs one
// machine of the control plane (the agent's route to it); "" for a local socket.
std::string FirstApiHost(const std::string& value);

}  // namespace gradhub
