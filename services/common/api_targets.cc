#include "services/common/api_targets.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstdlib>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace gradhub {
namespace {

constexpr const char* kSchemes[] = {"dns:", "ipv4:", "ipv6:", "unix:", "unix-abstract:"};

bool HasScheme(const std::string& value) {
  return std::any_of(std::begin(kSchemes), std::end(kSchemes),
                     [&](const char* scheme) { return absl::StartsWith(value, scheme); });
}

absl::StatusOr<HostPort> SplitEntry(const std::string& flag, const std::string& entry) {
  auto refuse = [&](const std::string& why) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": \"", entry, "\" ", why, " (want HOST:PORT[,HOST:PORT...])"));
  };
  HostPort split;
  size_t colon;
  if (absl::StartsWith(entry, "[")) {  // [v6]:port
    const size_t close = entry.find(']');
    if (close == std::string::npos) return refuse("has no closing ]");
    split.host = entry.substr(1, close - 1);
    colon = close + 1;
    if (colon >= entry.size() || entry[colon] != ':') return refuse("has no port");
  } else {
    colon = entry.rfind(':');
    if (colon == std::string::npos) return refuse("has no port");
    split.host = entry.substr(0, colon);
    if (split.host.find(':') != std::string::npos) return refuse("is IPv6 without [brackets]");
  }
  split.port = entry.substr(colon + 1);
  int port = 0;
  if (!absl::SimpleAtoi(split.port, &port) || port < 1 || port > 65535) {
    return refuse("has no port from 1 to 65535");
  }
  if (split.host.empty()) return refuse("has no host");
  return split;
}

// Every address of one entry, numeric, by family.
struct Addresses {
  std::vector<std::string> v4, v6;
};

absl::StatusOr<Addresses> Resolve(const std::string& flag, const HostPort& entry) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* list = nullptr;
  if (const int error = getaddrinfo(entry.host.c_str(), entry.port.c_str(), &hints, &list);
      error != 0) {
    return absl::UnavailableError(
        absl::StrCat(flag, ": cannot resolve ", entry.host, ": ", gai_strerror(error)));
  }
  Addresses addresses;
  for (addrinfo* ai = list; ai != nullptr; ai = ai->ai_next) {
    char text[INET6_ADDRSTRLEN] = {};
    const void* raw =
        ai->ai_family == AF_INET
            ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(ai->ai_addr)->sin_addr)
            : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(ai->ai_addr)->sin6_addr);
    if (inet_ntop(ai->ai_family, raw, text, sizeof(text)) == nullptr) continue;
    auto& family = ai->ai_family == AF_INET ? addresses.v4 : addresses.v6;
    const std::string address = ai->ai_family == AF_INET
                                    ? absl::StrCat(text, ":", entry.port)
                                    : absl::StrCat("[", text, "]:", entry.port);
    if (std::find(family.begin(), family.end(), address) == family.end()) {
      family.push_back(address);
    }
  }
  freeaddrinfo(list);
  return addresses;
}

// Rule 3's choice of family, in the entries' order.
std::string ListTarget(const std::vector<Addresses>& resolved) {
  const auto every = [&](auto has) { return std::all_of(resolved.begin(), resolved.end(), has); };
  std::vector<std::string> chosen;
  if (every([](const Addresses& a) { return !a.v4.empty(); })) {
    for (const Addresses& a : resolved) chosen.insert(chosen.end(), a.v4.begin(), a.v4.end());
    return "ipv4:" + absl::StrJoin(chosen, ",");
  }
  if (every([](const Addresses& a) { return !a.v6.empty(); })) {
    for (const Addresses& a : resolved) chosen.insert(chosen.end(), a.v6.begin(), a.v6.end());
    return "ipv6:" + absl::StrJoin(chosen, ",");
  }
  for (const Addresses& a : resolved) {
    for (const std::string& v4 : a.v4)
      chosen.push_back("[::ffff:" + v4.substr(0, v4.rfind(':')) + "]" + v4.substr(v4.rfind(':')));
    chosen.insert(chosen.end(), a.v6.begin(), a.v6.end());
  }
  return "ipv6:" + absl::StrJoin(chosen, ",");
}

}  // namespace

absl::StatusOr<std::vector<HostPort>> SplitApiAddresses(const std::string& flag,
                                                        const std::string& value) {
  if (value.empty()) return absl::InvalidArgumentError(flag + ": empty (want HOST:PORT)");
  std::vector<HostPort> entries;
  const std::vector<std::string> texts = absl::StrSplit(value, ',');
  for (const std::string& entry : texts) {
    if (entry.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          flag, ": \"", value, "\" has an empty entry (want HOST:PORT[,HOST:PORT...])"));
    }
    absl::StatusOr<HostPort> split = SplitEntry(flag, entry);
    if (!split.ok()) return split.status();
    entries.push_back(*std::move(split));
  }
  return entries;
}

absl::StatusOr<ApiTarget> ParseApiTarget(const std::string& flag, const std::string& value) {
  ApiTarget target;
  if (HasScheme(value)) {  // rule 1
    target.target = value;
    target.hosts.push_back(FirstApiHost(value));
    return target;
  }
  absl::StatusOr<std::vector<HostPort>> entries = SplitApiAddresses(flag, value);
  if (!entries.ok()) return entries.status();
  for (const HostPort& entry : *entries) target.hosts.push_back(entry.host);
  if (entries->size() == 1) {  // rule 2
    target.target = "dns:///" + value;
    return target;
  }
  std::vector<Addresses> resolved;
  for (const HostPort& entry : *entries) {
    absl::StatusOr<Addresses> addresses = Resolve(flag, entry);
    if (!addresses.ok()) return addresses.status();
    resolved.push_back(*std::move(addresses));
  }
  target.target = ListTarget(resolved);
  target.tls_name = entries->front().host;
  return target;
}

grpc::ChannelArguments FailoverChannelArguments(const ApiTarget& target,
                                                std::chrono::milliseconds connect_timeout,
                                                grpc::ChannelArguments base) {
  base.SetLoadBalancingPolicyName("pick_first");
  // Reconnect waits and the connect timeout (see the header): gRPC names the connect timeout
  // MIN_RECONNECT_BACKOFF.
  base.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 200);
  base.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  base.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, static_cast<int>(connect_timeout.count()));
  // A closed connection's re-resolution answered within 500 ms, not 30 s (see the header).
  base.SetInt(GRPC_ARG_DNS_MIN_TIME_BETWEEN_RESOLUTIONS_MS, 500);
  // A frozen or cut-off replica (its kernel still acknowledges) is noticed only by pings.
  base.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 2000);
  base.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 1000);
  base.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  if (!target.tls_name.empty()) base.SetSslTargetNameOverride(target.tls_name);
  return base;
}

std::shared_ptr<grpc::Channel> CreateApiChannel(
    const ApiTarget& target, const std::shared_ptr<grpc::ChannelCredentials>& credentials,
    std::chrono::milliseconds connect_timeout, grpc::ChannelArguments base) {
  return grpc::CreateCustomChannel(
      target.target, credentials,
      FailoverChannelArguments(target, connect_timeout, std::move(base)));
}

std::string FirstApiHost(const std::string& value) {
  std::string rest = value;
  if (absl::StartsWith(rest, "unix:") || absl::StartsWith(rest, "unix-abstract:")) return "";
  for (const char* scheme : {"dns:///", "ipv4:", "ipv6:", "dns:"}) {
    if (absl::StartsWith(rest, scheme)) rest = rest.substr(std::char_traits<char>::length(scheme));
  }
  rest = rest.substr(0, rest.find(','));
  if (absl::StartsWith(rest, "[")) {
    const size_t close = rest.find(']');
    return close == std::string::npos ? rest.substr(1) : rest.substr(1, close - 1);
  }
  const size_t colon = rest.rfind(':');
  return colon == std::string::npos ? rest : rest.substr(0, colon);
}

}  // namespace gradhub
