#include "tests/support/packet_filter.h"

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <iostream>
#include <regex>
#include <sstream>
#include <stdexcept>

#include "tests/support/subprocess.h"

namespace gradhub::testing {
namespace {

// Every rule of a PacketFilter goes into both chains, input first: rules_[h] holds the
// nftables handles of handle h's rules in that order, so an even index is a rule of the input
// chain and an odd one of the output chain (nftables deletes a rule by chain and handle).
constexpr const char* kChains[] = {"input", "output"};

// The nft program: on $PATH, or in the sbin directories a non-login root shell may lack.
std::string NftPath() {
  std::vector<std::string> dirs;
  if (const char* path = std::getenv("PATH")) {
    std::stringstream split(path);
    for (std::string dir; std::getline(split, dir, ':');) dirs.push_back(dir);
  }
  for (const char* dir : {"/usr/sbin", "/sbin", "/usr/bin", "/bin"}) dirs.push_back(dir);
  for (const std::string& dir : dirs) {
    const std::string candidate = dir + "/nft";
    if (!dir.empty() && access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

std::string NsenterPath() {
  for (const char* path : {"/usr/bin/nsenter", "/bin/nsenter", "/usr/sbin/nsenter"}) {
    if (access(path, X_OK) == 0) return path;
  }
  return "nsenter";
}

// nft with `args` in namespace `netns` ("" = ours); its stdout, or std::runtime_error naming
// the command and what nft said.
std::string Nft(const std::string& netns, const std::vector<std::string>& args) {
  std::vector<std::string> argv;
  if (!netns.empty()) argv = {NsenterPath(), "--net=/run/netns/" + netns};
  argv.push_back(NftPath());
  argv.insert(argv.end(), args.begin(), args.end());
  const RunResult run = Run(argv, {}, std::chrono::seconds(10));
  if (run.exit_code != 0) {
    std::string command;
    for (const std::string& arg : argv) command += (command.empty() ? "" : " ") + arg;
    throw std::runtime_error(command + ": exit " + std::to_string(run.exit_code) + ": " + run.err);
  }
  return run.out;
}

// Refuses what would make an nft expression of something else than an address.
const std::string& CheckedAddress(const std::string& address) {
  static const std::regex ipv4(R"(\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3})");
  if (!std::regex_match(address, ipv4)) {
    throw std::invalid_argument("not an IPv4 address: '" + address + "'");
  }
  return address;
}

int CheckedPort(int port) {
  if (port <= 0 || port > 65535) throw std::invalid_argument("bad port " + std::to_string(port));
  return port;
}

// Adds a drop rule of each of `matches` to both chains of `table` (in kChains' order); returns
// their nftables handles.
std::vector<int> AddDropRules(const std::string& netns, const std::string& table,
                              const std::vector<std::string>& matches) {
  static const std::regex echoed(R"(# handle (\d+))");
  std::vector<int> handles;
  for (const std::string& match : matches) {
    for (const char* chain : kChains) {
      const std::string out =
          Nft(netns, {"--echo", "--handle", "add", "rule", "inet", table, chain, match + " drop"});
      std::smatch found;
      if (!std::regex_search(out, found, echoed)) {
        throw std::runtime_error("nft did not echo the handle of '" + match + "': " + out);
      }
      handles.push_back(std::stoi(found[1]));
    }
  }
  return handles;
}

}  // namespace

bool PacketFilter::Available(std::string* why) {
  if (geteuid() != 0) {
    *why = "needs root to change nftables rules (euid " + std::to_string(geteuid()) + ")";
    return false;
  }
  if (NftPath().empty()) {
    *why = "the nft program is not installed (Debian's nftables; make setup installs it)";
    return false;
  }
  try {
    PacketFilter probe;  // creates a table, and deletes it when it goes
  } catch (const std::exception& e) {
    *why = std::string("cannot create an nftables table (nf_tables in the kernel?): ") + e.what();
    return false;
  }
  return true;
}

PacketFilter::PacketFilter(std::string netns) : netns_(std::move(netns)) {
  static std::atomic<int> counter{0};
  table_ = "gradhub_test_" + std::to_string(getpid()) + "_" + std::to_string(counter++);
  Nft(netns_, {"add", "table", "inet", table_});
  for (const char* chain : kChains) {
    Nft(netns_, {"add", "chain", "inet", table_, chain,
                 std::string("{ type filter hook ") + chain + " priority 0; policy accept; }"});
  }
}

PacketFilter::~PacketFilter() {
  try {
    Nft(netns_, {"delete", "table", "inet", table_});
  } catch (const std::exception& e) {
    std::cerr << "PacketFilter: could not delete table " << table_ << ": " << e.what() << "\n";
  }
}

int PacketFilter::DropAddress(const std::string& address) {
  const std::string& a = CheckedAddress(address);
  rules_.push_back(AddDropRules(netns_, table_, {"ip saddr " + a, "ip daddr " + a}));
  return static_cast<int>(rules_.size()) - 1;
}

int PacketFilter::DropTcpPort(int port) {
  const std::string p = std::to_string(CheckedPort(port));
  rules_.push_back(AddDropRules(netns_, table_, {"tcp dport " + p, "tcp sport " + p}));
  return static_cast<int>(rules_.size()) - 1;
}

int PacketFilter::DropTcpEndpoint(const std::string& address, int port) {
  const std::string& a = CheckedAddress(address);
  const std::string p = std::to_string(CheckedPort(port));
  rules_.push_back(AddDropRules(
      netns_, table_, {"ip daddr " + a + " tcp dport " + p, "ip saddr " + a + " tcp sport " + p}));
  return static_cast<int>(rules_.size()) - 1;
}

void PacketFilter::Lift(int handle) {
  if (handle < 0 || handle >= static_cast<int>(rules_.size())) {
    throw std::invalid_argument("no rule " + std::to_string(handle) + " in " + table_);
  }
  std::vector<int>& handles = rules_[handle];
  for (size_t i = 0; i < handles.size(); ++i) {
    Nft(netns_,
        {"delete", "rule", "inet", table_, kChains[i % 2], "handle", std::to_string(handles[i])});
  }
  handles.clear();  // lifted: a second Lift does nothing
}

void PacketFilter::LiftAll() {
  for (size_t handle = 0; handle < rules_.size(); ++handle) Lift(static_cast<int>(handle));
}

}  // namespace gradhub::testing
