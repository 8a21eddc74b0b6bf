#include "tests/support/network_hosts.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "tests/support/subprocess.h"

namespace gradhub::testing {
namespace {

constexpr char kIp[] = "/usr/sbin/ip";
constexpr char kTc[] = "/usr/sbin/tc";
constexpr char kNsenter[] = "/usr/bin/nsenter";
constexpr char kUnshare[] = "/usr/bin/unshare";

std::string Join(const std::vector<std::string>& argv) {
  std::string text;
  for (const auto& arg : argv) text += (text.empty() ? "" : " ") + arg;
  return text;
}

// Runs a set-up command; throws with its output when it fails (step 3).
void Must(const std::vector<std::string>& argv) {
  const RunResult result = Run(argv, {}, std::chrono::seconds(30));
  if (result.exit_code != 0) {
    throw std::runtime_error("NetworkHosts: `" + Join(argv) + "` failed (" +
                             std::to_string(result.exit_code) + "): " + result.err + result.out);
  }
}

// Best effort, for tearing down.
void Try(const std::vector<std::string>& argv) { Run(argv, {}, std::chrono::seconds(30)); }

// Step 1: a /24 in 10.64.0.0/10 that no address or route of this machine mentions.
std::string FreePrefix(int seed) {
  const RunResult addresses = Run({kIp, "-4", "addr"}, {}, std::chrono::seconds(10));
  const RunResult routes = Run({kIp, "-4", "route"}, {}, std::chrono::seconds(10));
  for (int attempt = 0; attempt < 256; ++attempt) {
    const int value = seed + attempt * 7919;
    const std::string prefix =
        "10." + std::to_string(64 + value % 64) + "." + std::to_string((value / 64) % 256) + ".";
    if (addresses.out.find(prefix) == std::string::npos &&
        routes.out.find(prefix) == std::string::npos) {
      return prefix;
    }
  }
  throw std::runtime_error("NetworkHosts: no free /24 in 10.64.0.0/10");
}

std::string Hostname() {
  char name[256] = {};
  gethostname(name, sizeof(name) - 1);
  return name;
}

}  // namespace

bool NetworkHosts::Available(std::string* why) {
  if (geteuid() != 0) {
    *why = "network namespaces need root (CI runs as root)";
    return false;
  }
  for (const char* tool : {kIp, kTc, kNsenter, kUnshare}) {
    if (access(tool, X_OK) != 0) {
      *why = std::string(tool) + " is missing (make setup installs it)";
      return false;
    }
  }
  if (!PacketFilter::Available(why)) return false;
  const std::string probe = "ghprobe" + std::to_string(getpid() % 100000);
  const RunResult made = Run({kIp, "netns", "add", probe}, {}, std::chrono::seconds(10));
  if (made.exit_code != 0) {
    *why = "cannot make a network namespace: " + made.err;
    return false;
  }
  Try({kIp, "netns", "del", probe});
  return true;
}

NetworkHosts::NetworkHosts(const std::vector<std::string>& hosts) {
  const int pid = static_cast<int>(getpid());
  id_ = "gh" + std::to_string(pid % 100000);
  switch_netns_ = id_ + "-sw";
  bridge_ = id_ + "br";
  hub_link_ = id_ + "hub";
  prefix_ = FreePrefix(pid);
  hub_address_ = prefix_ + "1";
  hosts_file_ = "/tmp/" + id_ + ".hosts";
  std::ofstream(hosts_file_) << "127.0.0.1 localhost\n127.0.1.1 " << Hostname() << "\n";
  try {
    // Leftovers of a crashed run with our pid.
    Try({kIp, "link", "del", hub_link_});
    Try({kIp, "netns", "del", switch_netns_});
    // Step 2.
    Must({kIp, "netns", "add", switch_netns_});
    Must({kIp, "-n", switch_netns_, "link", "add", bridge_, "type", "bridge"});
    Must({kIp, "-n", switch_netns_, "link", "set", bridge_, "up"});
    // Step 3.
    const std::string hub_port = id_ + "up";
    Must({kIp, "link", "add", hub_link_, "type", "veth", "peer", "name", hub_port, "netns",
          switch_netns_});
    Must({kIp, "-n", switch_netns_, "link", "set", hub_port, "master", bridge_, "up"});
    Must({kIp, "addr", "add", hub_address_ + "/24", "dev", hub_link_});
    Must({kIp, "link", "set", hub_link_, "up"});
    for (size_t i = 0; i < hosts.size(); ++i) AddHost(hosts[i], static_cast<int>(i));
  } catch (...) {
    TearDown();
    throw;
  }
}

// Step 4 for one host.
void NetworkHosts::AddHost(const std::string& name, int index) {
  if (name.empty() || name.size() > 4 ||
      !std::all_of(name.begin(), name.end(), [](char c) { return isdigit(c) || islower(c); })) {
    throw std::invalid_argument("NetworkHosts: host name '" + name + "' is not [a-z0-9]{1,4}");
  }
  Host host;
  host.name = name;
  host.netns = id_ + "-" + name;
  host.outer_link = id_ + "v" + std::to_string(index);
  host.address = prefix_ + std::to_string(10 + index);
  const std::string inner = id_ + "i" + std::to_string(index);
  Try({kIp, "netns", "del", host.netns});
  Must({kIp, "netns", "add", host.netns});
  hosts_.push_back(std::move(host));  // from here the destructor removes it
  const Host& made = hosts_.back();
  Must({kIp, "-n", switch_netns_, "link", "add", made.outer_link, "type", "veth", "peer", "name",
        inner, "netns", made.netns});
  Must({kIp, "-n", made.netns, "link", "set", inner, "name", "eth0"});
  Must({kIp, "-n", made.netns, "addr", "add", made.address + "/24", "dev", "eth0"});
  Must({kIp, "-n", made.netns, "link", "set", "eth0", "up"});
  Must({kIp, "-n", made.netns, "link", "set", "lo", "up"});
  Must({kIp, "-n", made.netns, "route", "add", "default", "via", hub_address_});
  Must({kIp, "-n", switch_netns_, "link", "set", made.outer_link, "master", bridge_, "up"});
}

NetworkHosts::~NetworkHosts() { TearDown(); }

void NetworkHosts::TearDown() {
  for (Host& host : hosts_) {
    host.filter.reset();
    Try({kIp, "netns", "del", host.netns});  // takes eth0, and so its peer, with it
  }
  hosts_.clear();
  Try({kIp, "link", "del", hub_link_});  // takes its peer with it
  if (!switch_netns_.empty()) Try({kIp, "netns", "del", switch_netns_});
  if (!hosts_file_.empty()) unlink(hosts_file_.c_str());
  hosts_file_.clear();
}

const NetworkHosts::Host& NetworkHosts::host(const std::string& name) const {
  for (const Host& host : hosts_) {
    if (host.name == name) return host;
  }
  throw std::invalid_argument("NetworkHosts: no host '" + name + "'");
}

NetworkHosts::Host& NetworkHosts::host(const std::string& name) {
  return const_cast<Host&>(static_cast<const NetworkHosts*>(this)->host(name));
}

std::string NetworkHosts::address(const std::string& name) const { return host(name).address; }

std::string NetworkHosts::netns(const std::string& name) const { return host(name).netns; }

std::vector<std::string> NetworkHosts::Command(const std::string& name,
                                               std::vector<std::string> argv,
                                               CommandOptions options) const {
  std::vector<std::string> command = {kNsenter, "--net=/run/netns/" + host(name).netns, "--"};
  if (options.hostname_resolves_to_loopback) {
    // A mount namespace of the process's own (unshare's default propagation is private), so
    // the bind mount is seen by it and its children only.
    command.insert(command.end(), {kUnshare, "--mount", "--", "/bin/sh", "-c",
                                   "mount --bind \"$0\" /etc/hosts && exec \"$@\"", hosts_file_});
  }
  command.insert(command.end(), argv.begin(), argv.end());
  return command;
}

PacketFilter& NetworkHosts::filter(const std::string& name) {
  Host& h = host(name);
  if (!h.filter) h.filter = std::make_unique<PacketFilter>(h.netns);
  return *h.filter;
}

void NetworkHosts::Partition(const std::string& a, const std::string& b) {
  const int on_a = filter(a).DropAddress(address(b));
  const int on_b = filter(b).DropAddress(address(a));
  partitions_[{a, b}] = {on_a, on_b};
}

void NetworkHosts::Heal(const std::string& a, const std::string& b) {
  const auto found = partitions_.find({a, b});
  if (found == partitions_.end()) throw std::invalid_argument("NetworkHosts: no such partition");
  filter(a).Lift(found->second.first);
  filter(b).Lift(found->second.second);
  partitions_.erase(found);
}

int64_t NetworkHosts::LinkBytes(const std::string& name) const {
  // The port lives in the switch's namespace, whose /sys only `ip netns exec` mounts.
  const std::string statistics = "/sys/class/net/" + host(name).outer_link + "/statistics/";
  const RunResult counters = Run({kIp, "netns", "exec", switch_netns_, "cat",
                                  statistics + "rx_bytes", statistics + "tx_bytes"},
                                 {}, std::chrono::seconds(10));
  if (counters.exit_code != 0) {
    throw std::runtime_error("NetworkHosts: cannot read " + statistics + ": " + counters.err);
  }
  std::istringstream in(counters.out);
  int64_t rx = 0, tx = 0;
  in >> rx >> tx;
  return rx + tx;
}

void NetworkHosts::CapBandwidth(const std::string& name, int64_t bits_per_second) {
  const Host& h = host(name);
  for (const std::vector<std::string>& device : {std::vector<std::string>{kTc, "-n", switch_netns_},
                                                 std::vector<std::string>{kTc, "-n", h.netns}}) {
    const std::string link = device[2] == switch_netns_ ? h.outer_link : "eth0";
    std::vector<std::string> command = device;
    if (bits_per_second <= 0) {
      command.insert(command.end(), {"qdisc", "del", "dev", link, "root"});
      Try(command);
      continue;
    }
    // The bucket holds 10 ms at the rate (at least 64 KiB), well above rate / HZ, so tbf does
    // not throttle below the rate; 50 ms of queue before it drops.
    const int64_t burst = std::max<int64_t>(bits_per_second / 8 / 100, 64 * 1024);
    command.insert(command.end(), {"qdisc", "replace", "dev", link, "root", "tbf", "rate",
                                   std::to_string(bits_per_second) + "bit", "burst",
                                   std::to_string(burst), "latency", "50ms"});
    Must(command);
  }
}

}  // namespace gradhub::testing
