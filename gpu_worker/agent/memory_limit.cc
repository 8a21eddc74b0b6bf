#include "gpu_worker/agent/memory_limit.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "services/common/sha256.h"

namespace gradhub::agent {
namespace {

constexpr char kV2Mount[] = "/sys/fs/cgroup";
constexpr char kV2HybridMount[] = "/sys/fs/cgroup/unified";
constexpr char kV1MemoryMount[] = "/sys/fs/cgroup/memory";

bool Exists(const std::string& path) { return access(path.c_str(), F_OK) == 0; }

std::string ReadSmallFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

absl::Status WriteFile(const std::string& path, const std::string& value) {
  const int fd = open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return absl::InternalError(absl::StrCat("open ", path, ": ", std::strerror(errno)));
  const ssize_t written = write(fd, value.data(), value.size());
  const int error = errno;
  close(fd);
  if (written != static_cast<ssize_t>(value.size())) {
    return absl::InternalError(
        absl::StrCat("write '", value, "' to ", path, ": ", std::strerror(error)));
  }
  return absl::OkStatus();
}

bool ListsWord(const std::string& text, const std::string& word) {
  for (absl::string_view item : absl::StrSplit(text, absl::ByAnyChar(" \n"), absl::SkipEmpty())) {
    if (item == word) return true;
  }
  return false;
}

// The agent's own cgroup path in the v1 memory hierarchy and in the v2 one ("" if none).
void OwnCgroups(std::string* v1_memory, std::string* v2) {
  std::istringstream lines(ReadSmallFile("/proc/self/cgroup"));
  for (std::string line; std::getline(lines, line);) {
    const std::vector<std::string> parts = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (parts.size() != 3) continue;
    if (parts[0] == "0" && parts[1].empty()) *v2 = parts[2];
    for (absl::string_view controller : absl::StrSplit(parts[1], ',')) {
      if (controller == "memory") *v1_memory = parts[2];
    }
  }
}

std::string Join(const std::string& mount, const std::string& path) {
  return path == "/" || path.empty() ? mount : mount + path;
}

bool UsableV2(const std::string& dir) {
  return access(dir.c_str(), W_OK) == 0 &&
         ListsWord(ReadSmallFile(dir + "/cgroup.controllers"), "memory");
}

bool UsableV1(const std::string& dir) {
  return access(dir.c_str(), W_OK) == 0 && Exists(dir + "/memory.limit_in_bytes");
}

absl::Status MakeDir(const std::string& path) {
  if (mkdir(path.c_str(), 0755) == 0 || errno == EEXIST) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("mkdir ", path, ": ", std::strerror(errno)));
}

// v2: a child of `parent` gets the memory controller only if `parent` delegates it.
absl::Status DelegateMemory(const std::string& parent) {
  if (ListsWord(ReadSmallFile(parent + "/cgroup.subtree_control"), "memory")) {
    return absl::OkStatus();
  }
  return WriteFile(parent + "/cgroup.subtree_control", "+memory");
}

absl::Status SetLimits(MemoryMechanism version, const std::string& dir, int64_t limit) {
  const std::string value = std::to_string(limit);
  if (version == MemoryMechanism::kCgroupV2) {
    if (absl::Status status = WriteFile(dir + "/memory.max", value); !status.ok()) return status;
    // No swap: a rank at its limit must be stopped, not swap the node to a crawl.
    if (Exists(dir + "/memory.swap.max")) (void)WriteFile(dir + "/memory.swap.max", "0");
    // An OOM kill takes the whole rank (every process it forked), not one of its threads' hosts.
    if (Exists(dir + "/memory.oom.group")) (void)WriteFile(dir + "/memory.oom.group", "1");
    return absl::OkStatus();
  }
  if (absl::Status status = WriteFile(dir + "/memory.limit_in_bytes", value); !status.ok()) {
    return status;
  }
  // memory + swap may not be below memory alone, so it is written second.
  if (Exists(dir + "/memory.memsw.limit_in_bytes")) {
    (void)WriteFile(dir + "/memory.memsw.limit_in_bytes", value);
  }
  return absl::OkStatus();
}

int64_t ReadNumber(const std::string& path) {
  int64_t value = 0;
  const std::string text(absl::StripAsciiWhitespace(ReadSmallFile(path)));
  return absl::SimpleAtoi(text, &value) ? value : 0;
}

}  // namespace

const char* MemoryMechanismName(MemoryMechanism mechanism) {
  switch (mechanism) {
    case MemoryMechanism::kNone:
      return "none";
    case MemoryMechanism::kCgroupV2:
      return "cgroup-v2";
    case MemoryMechanism::kCgroupV1:
      return "cgroup-v1";
    case MemoryMechanism::kRlimit:
      return "rlimit";
  }
  return "?";
}

CgroupProbe ProbeCgroups(const std::string& override_parent) {
  CgroupProbe probe;
  if (!override_parent.empty()) {
    if (UsableV2(override_parent)) probe.v2_parent = override_parent;
    if (UsableV1(override_parent)) probe.v1_parent = override_parent;
    return probe;
  }
  std::string v1_memory, v2;
  OwnCgroups(&v1_memory, &v2);
  // v2: only the root cgroup may hold processes (the agent) and delegate controllers at once,
  // so the agent's own cgroup serves only when it is the root; otherwise --cgroup-parent.
  for (const char* mount : {kV2Mount, kV2HybridMount}) {
    if (!Exists(std::string(mount) + "/cgroup.controllers")) continue;
    if ((v2 == "/" || v2.empty()) && UsableV2(mount)) probe.v2_parent = mount;
    break;
  }
  if (!v1_memory.empty() && UsableV1(Join(kV1MemoryMount, v1_memory))) {
    probe.v1_parent = Join(kV1MemoryMount, v1_memory);
  }
  return probe;
}

absl::StatusOr<MemoryMechanism> ChooseMemoryMechanism(const std::string& requested,
                                                      int64_t limit_bytes,
                                                      const CgroupProbe& probe) {
  if (limit_bytes <= 0 || requested == "none") return MemoryMechanism::kNone;
  if (requested == "rlimit") return MemoryMechanism::kRlimit;
  if (requested == "cgroup-v2" || requested == "cgroup-v1") {
    const bool v2 = requested == "cgroup-v2";
    if ((v2 ? probe.v2_parent : probe.v1_parent).empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--memory-isolation: ", requested, " is not usable here (no writable ",
                       v2 ? "cgroup v2 with the memory controller" : "cgroup v1 memory hierarchy",
                       "; see --cgroup-parent)"));
    }
    return v2 ? MemoryMechanism::kCgroupV2 : MemoryMechanism::kCgroupV1;
  }
  if (requested != "auto") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--memory-isolation: '", requested, "' is not auto, cgroup-v2, cgroup-v1, rlimit or none"));
  }
  if (!probe.v2_parent.empty()) return MemoryMechanism::kCgroupV2;
  if (!probe.v1_parent.empty()) return MemoryMechanism::kCgroupV1;
  return MemoryMechanism::kRlimit;
}

std::string AgentCgroupName(const std::string& node_name, const std::string& work_dir) {
  return absl::StrCat(std::string(kAgentCgroupPrefix), node_name, "-",
                      Sha256Hex(work_dir).substr(0, 12));
}

absl::StatusOr<std::string> PrepareAgentCgroup(MemoryMechanism version, const std::string& parent,
                                               const std::string& name) {
  const std::string dir = parent + "/" + name;
  if (version == MemoryMechanism::kCgroupV2) {
    if (absl::Status status = DelegateMemory(parent); !status.ok()) return status;
  }
  if (absl::Status status = MakeDir(dir); !status.ok()) return status;
  return dir;
}

absl::StatusOr<std::unique_ptr<MemoryCgroup>> MemoryCgroup::Create(MemoryMechanism version,
                                                                   const std::string& parent,
                                                                   const std::string& name,
                                                                   int64_t limit_bytes) {
  if (version != MemoryMechanism::kCgroupV1 && version != MemoryMechanism::kCgroupV2) {
    return absl::InvalidArgumentError("MemoryCgroup: not a cgroup mechanism");
  }
  const std::string path = parent + "/" + name;
  // The agent's directory may have been removed under it (an operator's cleanup): made again.
  if (absl::Status status = MakeDir(parent); !status.ok()) return status;
  if (version == MemoryMechanism::kCgroupV2) {
    if (absl::Status status = DelegateMemory(parent); !status.ok()) return status;
  }
  if (mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) {
    return absl::InternalError(absl::StrCat("mkdir ", path, ": ", std::strerror(errno)));
  }
  absl::Status limited = SetLimits(version, path, limit_bytes);
  const int fd = limited.ok() ? open((path + "/cgroup.procs").c_str(), O_WRONLY | O_CLOEXEC) : -1;
  if (fd < 0) {
    rmdir(path.c_str());
    return limited.ok() ? absl::InternalError(
                              absl::StrCat("open ", path, "/cgroup.procs: ", std::strerror(errno)))
                        : limited;
  }
  return std::unique_ptr<MemoryCgroup>(new MemoryCgroup(version, path, fd, limit_bytes));
}

MemoryCgroup::~MemoryCgroup() {
  if (procs_fd_ >= 0) close(procs_fd_);
  Remove();
}

int64_t ParseOomKills(const std::string& text) {
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    const std::vector<std::string> parts = absl::StrSplit(line, ' ', absl::SkipEmpty());
    int64_t value = 0;
    if (parts.size() == 2 && parts[0] == "oom_kill" && absl::SimpleAtoi(parts[1], &value)) {
      return value;
    }
  }
  return 0;
}

int64_t MemoryCgroup::OomKills() const {
  return ParseOomKills(ReadSmallFile(
      path_ + (version_ == MemoryMechanism::kCgroupV2 ? "/memory.events" : "/memory.oom_control")));
}

int64_t MemoryCgroup::PeakBytes() const {
  return ReadNumber(path_ + (version_ == MemoryMechanism::kCgroupV2
                                 ? "/memory.peak"
                                 : "/memory.max_usage_in_bytes"));
}

void MemoryCgroup::KillAll() const {
  std::istringstream pids(ReadSmallFile(path_ + "/cgroup.procs"));
  for (std::string line; std::getline(pids, line);) {
    int pid = 0;
    if (absl::SimpleAtoi(line, &pid) && pid > 0) kill(pid, SIGKILL);
  }
}

bool MemoryCgroup::Remove() {
  if (removed_) return true;
  if (procs_fd_ >= 0) {
    close(procs_fd_);
    procs_fd_ = -1;
  }
  removed_ = rmdir(path_.c_str()) == 0 || errno == ENOENT;
  return removed_;
}

int RemoveLeftoverCgroups(const std::string& dir) {
  if (dir.empty()) return 0;
  DIR* entries = opendir(dir.c_str());
  if (entries == nullptr) return 0;
  std::vector<std::string> groups;
  while (const dirent* entry = readdir(entries)) {
    const std::string name = entry->d_name;
    if (entry->d_type == DT_DIR && name != "." && name != "..") groups.push_back(dir + "/" + name);
  }
  closedir(entries);
  int removed = 0;
  for (const std::string& group : groups) {
    // Whatever still runs there is a rank of a dead agent (or escaped its process group).
    std::istringstream pids(ReadSmallFile(group + "/cgroup.procs"));
    for (std::string line; std::getline(pids, line);) {
      int pid = 0;
      if (absl::SimpleAtoi(line, &pid) && pid > 0) kill(pid, SIGKILL);
    }
    for (int tries = 0; tries < 50; ++tries) {  // SIGKILLed processes take a moment to go
      if (rmdir(group.c_str()) == 0 || errno != EBUSY) break;
      usleep(20000);
    }
    removed += access(group.c_str(), F_OK) != 0;
  }
  return removed;
}

int64_t MachineMemoryBytes() {
  std::istringstream lines(ReadSmallFile("/proc/meminfo"));
  for (std::string line; std::getline(lines, line);) {
    const std::vector<std::string> parts = absl::StrSplit(line, ' ', absl::SkipEmpty());
    int64_t kib = 0;
    if (parts.size() >= 2 && parts[0] == "MemTotal:" && absl::SimpleAtoi(parts[1], &kib)) {
      return kib * 1024;
    }
  }
  return 0;
}

}  // namespace gradhub::agent
