#include "gpu_worker/agent/node_address.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "services/common/api_targets.h"

namespace gradhub::agent {
namespace {

// getnameinfo's numeric form of `address`.
std::string NumericHost(const sockaddr* address, socklen_t length) {
  char host[NI_MAXHOST] = {};
  if (getnameinfo(address, length, host, sizeof(host), nullptr, 0, NI_NUMERICHOST) != 0) return "";
  std::string text = host;
  // A link-local IPv6 address carries its zone ("fe80::1%eth0"); peers need it without.
  const size_t zone = text.find('%');
  return zone == std::string::npos ? text : text.substr(0, zone);
}

// Every address `host` resolves to (numeric hosts included), for UDP.
struct Resolved {
  addrinfo* list = nullptr;
  ~Resolved() {
    if (list != nullptr) freeaddrinfo(list);
  }
};

}  // namespace

bool IsLoopbackAddress(const std::string& address) {
  in_addr v4{};
  if (inet_pton(AF_INET, address.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  if (inet_pton(AF_INET6, address.c_str(), &v6) == 1) return IN6_IS_ADDR_LOOPBACK(&v6) != 0;
  return false;
}

std::string TargetHost(const std::string& target) { return FirstApiHost(target); }

absl::StatusOr<std::string> ChooseAdvertisedAddress(const std::string& flag, bool api_is_local,
                                                    const std::string& route_source) {
  if (!flag.empty()) {
    if (IsLoopbackAddress(flag) && !api_is_local) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--address: ", flag,
          " is a loopback address, but gradhub-api is on another machine: ranks of other "
          "nodes would connect to themselves. Give an address they can reach, or leave "
          "--address out (the source address of the route to the api)"));
    }
    return flag;
  }
  if (route_source.empty()) {
    return absl::FailedPreconditionError(
        "--address: not given, and no route to gradhub-api (--server) was found to take the "
        "source address of; give --address");
  }
  return route_source;
}

absl::StatusOr<std::string> RouteSourceAddress(const std::string& host) {
  if (host.empty()) return std::string("127.0.0.1");  // a local socket: one machine
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  Resolved resolved;
  if (const int error = getaddrinfo(host.c_str(), "7", &hints, &resolved.list); error != 0) {
    return absl::UnavailableError(absl::StrCat("cannot resolve ", host, ": ", gai_strerror(error)));
  }
  std::string last_error = "no address";
  for (addrinfo* ai = resolved.list; ai != nullptr; ai = ai->ai_next) {
    const int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) continue;
    sockaddr_storage local{};
    socklen_t length = sizeof(local);
    // connect() on UDP only picks the route and the source address; nothing is sent.
    const bool routed = connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
                        getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length) == 0;
    if (!routed) last_error = std::strerror(errno);
    close(fd);
    if (routed) return NumericHost(reinterpret_cast<sockaddr*>(&local), length);
  }
  return absl::UnavailableError(absl::StrCat("no route to ", host, ": ", last_error));
}

bool ResolvesToLoopback(const std::string& host) {
  if (host.empty()) return true;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  Resolved resolved;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &resolved.list) != 0) return false;
  for (addrinfo* ai = resolved.list; ai != nullptr; ai = ai->ai_next) {
    if (!IsLoopbackAddress(NumericHost(ai->ai_addr, ai->ai_addrlen))) return false;
  }
  return resolved.list != nullptr;
}

std::string InterfaceOf(const std::string& address) {
  ifaddrs* interfaces = nullptr;
  if (getifaddrs(&interfaces) != 0) return "";
  std::string name;
  for (ifaddrs* i = interfaces; i != nullptr && name.empty(); i = i->ifa_next) {
    if (i->ifa_addr == nullptr) continue;
    const int family = i->ifa_addr->sa_family;
    if (family != AF_INET && family != AF_INET6) continue;
    const socklen_t length = family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
    if (NumericHost(i->ifa_addr, length) == address) name = i->ifa_name;
  }
  freeifaddrs(interfaces);
  return name;
}

namespace {

// One entry of StoreAddressForRanks.
std::string StoreEntryForRanks(const std::string& store_address, const std::string& api_host) {
  const std::string store_host = TargetHost(store_address);
  if (store_address.empty() || !IsLoopbackAddress(store_host) || api_host.empty() ||
      IsLoopbackAddress(api_host) || api_host == "localhost") {
    return store_address;
  }
  const size_t colon = store_address.rfind(':');
  const size_t bracket = store_address.rfind(']');
  const bool has_port =
      colon != std::string::npos && (bracket == std::string::npos || colon > bracket);
  const std::string port = has_port ? store_address.substr(colon) : "";
  return (api_host.find(':') != std::string::npos ? "[" + api_host + "]" : api_host) + port;
}

}  // namespace

std::string StoreAddressForRanks(const std::string& store_address, const std::string& api_target) {
  // A gRPC target with a scheme ("ipv4:a:1,b:2", "dns:///s:1") is the operator's choice: as
  // given when it lists several addresses, as before when one.
  const bool has_scheme = absl::StrContains(store_address, ":/") ||
                          absl::StartsWith(store_address, "ipv4:") ||
                          absl::StartsWith(store_address, "ipv6:");
  if (has_scheme && absl::StrContains(store_address, ',')) return store_address;
  if (store_address.find(',') == std::string::npos) {
    return StoreEntryForRanks(store_address, TargetHost(api_target));
  }
  std::vector<std::string> api_hosts;
  for (absl::string_view entry : absl::StrSplit(api_target, ',')) {
    api_hosts.push_back(TargetHost(std::string(entry)));
  }
  std::vector<std::string> entries;
  for (absl::string_view entry : absl::StrSplit(store_address, ',')) {
    // Entry i is replica i's: on the host of --server's entry i (or its first).
    const std::string& api_host =
        entries.size() < api_hosts.size() ? api_hosts[entries.size()] : api_hosts.front();
    entries.push_back(StoreEntryForRanks(std::string(entry), api_host));
  }
  return absl::StrJoin(entries, ",");
}

std::map<std::string, std::string> RankNetworkEnvironment(
    const std::string& address, const std::string& interface,
    const std::map<std::string, std::string>& operator_env) {
  std::map<std::string, std::string> env;
  // The operator's interface for Gloo wins over the advertised address: collectives may run on
  // another network than the control plane's (the trainer then listens on that interface).
  if (operator_env.count("GLOO_SOCKET_IFNAME") == 0) {
    env["GRADHUB_LISTEN_ADDRESS"] = address;
    if (!interface.empty()) env["GLOO_SOCKET_IFNAME"] = interface;
  }
  if (operator_env.count("NCCL_SOCKET_IFNAME") == 0 && !interface.empty()) {
    env["NCCL_SOCKET_IFNAME"] = interface;
  }
  return env;
}

}  // namespace gradhub::agent
