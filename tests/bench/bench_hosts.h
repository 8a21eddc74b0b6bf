// Ranks of a benchmark on separate "hosts": network namespaces that tests/bench/network/run.sh
// makes on a bridge, each with its own address. Opt-in, by environment, one entry per rank:
//   GRADHUB_BENCH_NETNS="ns_a,ns_a,ns_b,ns_b"            namespace (/run/netns/NAME) of each rank
//   GRADHUB_BENCH_ADDRESSES="10.1.2.2,10.1.2.2,10.1.2.3,10.1.2.3"  address each rank listens on
// The ranks' rendezvous is a FileStore, on the filesystem, which namespaces do not split; their
// collectives then go over the namespaces' interfaces (the bridge), never the shared loopback.
#pragma once

#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace gradhub::bench {

struct BenchHosts {
  std::vector<std::string> namespaces;  // one per rank
  std::vector<std::string> addresses;   // one per rank
};

inline std::vector<std::string> SplitCommas(const std::string& text) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(',', start);
    if (end == std::string::npos) end = text.size();
    parts.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return parts;
}

// Reads both variables, or nullopt when GRADHUB_BENCH_NETNS is unset or empty. Called in main
// before any rank is forked, so that a bad setting fails the bench at once instead of leaving
// the other ranks waiting at the rendezvous: throws std::invalid_argument when a list does not
// have `world` entries or a namespace does not exist.
inline std::optional<BenchHosts> BenchHostsFromEnvironment(int world) {
  const char* netns = std::getenv("GRADHUB_BENCH_NETNS");
  if (netns == nullptr || *netns == '\0') return std::nullopt;
  const char* addresses = std::getenv("GRADHUB_BENCH_ADDRESSES");
  BenchHosts hosts{SplitCommas(netns), SplitCommas(addresses ? addresses : "")};
  if (hosts.namespaces.size() != static_cast<size_t>(world) ||
      hosts.addresses.size() != static_cast<size_t>(world)) {
    throw std::invalid_argument("GRADHUB_BENCH_NETNS and GRADHUB_BENCH_ADDRESSES need " +
                                std::to_string(world) + " comma-separated entries, one per rank");
  }
  for (const std::string& name : hosts.namespaces) {
    if (access(("/run/netns/" + name).c_str(), R_OK) != 0) {
      throw std::invalid_argument("GRADHUB_BENCH_NETNS: no network namespace /run/netns/" + name);
    }
  }
  return hosts;
}

// Moves the calling thread into rank's network namespace and returns the address the rank
// listens on (GlooOptions::hostname). setns changes the calling thread only, and a thread
// inherits its creator's namespace: call this first thing in the rank, before the process group
// creates its threads and sockets, so that every socket of the rank is opened inside.
inline std::string JoinBenchHost(const BenchHosts& hosts, int rank) {
  const std::string path = "/run/netns/" + hosts.namespaces.at(rank);
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0 || setns(fd, CLONE_NEWNET) != 0) {
    const std::string why = std::strerror(errno);
    if (fd >= 0) close(fd);
    throw std::runtime_error("rank " + std::to_string(rank) + ": joining " + path + ": " + why);
  }
  close(fd);
  return hosts.addresses.at(rank);
}

}  // namespace gradhub::bench
