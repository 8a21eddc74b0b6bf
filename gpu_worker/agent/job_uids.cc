#include "gpu_worker/agent/job_uids.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "gpu_worker/agent/memory_limit.h"

namespace gradhub::agent {
namespace {

// Every uid of one /proc/<pid>/status ("Uid:\treal\teffective\tsaved\tfilesystem") into *uids,
// those in `range` only.
void AddProcessUids(const std::string& status_path, const UidRange& range,
                    std::set<uint32_t>* uids) {
  std::ifstream status(status_path);
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("Uid:", 0) != 0) continue;
    std::istringstream fields(line.substr(4));
    int64_t uid = 0;
    while (fields >> uid) {
      if (range.Contains(uid)) uids->insert(static_cast<uint32_t>(uid));
    }
    return;
  }
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// "<job id>.<attempt>.<rank>", the digits at least one each.
bool IsRankCgroupOf(std::string_view name, std::string_view job_id) {
  if (name.size() <= job_id.size() + 1 || name.substr(0, job_id.size()) != job_id ||
      name[job_id.size()] != '.') {
    return false;
  }
  const std::string_view numbers = name.substr(job_id.size() + 1);
  const size_t dot = numbers.find('.');
  auto digits = [](std::string_view text) {
    return !text.empty() && std::all_of(text.begin(), text.end(), [](char c) {
      return std::isdigit(static_cast<unsigned char>(c));
    });
  };
  return dot != std::string_view::npos && digits(numbers.substr(0, dot)) &&
         digits(numbers.substr(dot + 1));
}

bool IsPid(const char* name) {
  if (*name == '\0') return false;
  for (; *name != '\0'; ++name) {
    if (!std::isdigit(static_cast<unsigned char>(*name))) return false;
  }
  return true;
}

}  // namespace

uint32_t PreferredJobUid(const std::string& job_id, const UidRange& range) {
  uint64_t hash = 1469598103934665603ULL;  // FNV-1a, 64 bits
  for (const unsigned char c : job_id) {
    hash ^= c;
    hash *= 1099511628211ULL;
  }
  return static_cast<uint32_t>(range.base +
                               static_cast<int64_t>(hash % static_cast<uint64_t>(range.count)));
}

absl::StatusOr<uint32_t> ChooseJobUid(const std::string& job_id, const UidRange& range,
                                      const std::map<uint32_t, std::string>& holders,
                                      const std::set<uint32_t>& in_use) {
  for (const auto& [uid, holder] : holders) {  // rule 1
    if (holder == job_id) return uid;
  }
  const int64_t first = PreferredJobUid(job_id, range) - range.base;
  for (int64_t i = 0; i < range.count; ++i) {  // rule 2
    const auto uid = static_cast<uint32_t>(range.base + (first + i) % range.count);
    if (holders.count(uid) == 0 && in_use.count(uid) == 0) return uid;
  }
  return absl::ResourceExhaustedError(absl::StrCat(  // rule 3
      "every uid of --job-uid-base ", range.base, " and --job-uid-count ", range.count,
      " is held by another job or run by a process on this node"));
}

std::vector<uint32_t> ReleasableUids(const std::map<uint32_t, std::string>& holders,
                                     const std::set<std::string>& active_jobs,
                                     const std::set<uint32_t>& in_use) {
  std::vector<uint32_t> releasable;
  for (const auto& [uid, job] : holders) {
    if (active_jobs.count(job) == 0 && in_use.count(uid) == 0) releasable.push_back(uid);
  }
  return releasable;
}

namespace {

// One pass over /proc for both of Acquire's questions: into `all` the uids in `range` that
// some process runs as (rule 4), into `outside_job` those of processes that are not ranks of
// `job_id` ("" = none is; rule 2).
void ScanUids(const UidRange& range, const std::string& proc, const std::string& job_id,
              std::set<uint32_t>* all, std::set<uint32_t>* outside_job) {
  DIR* dir = opendir(proc.c_str());
  if (dir == nullptr) return;
  while (const dirent* entry = readdir(dir)) {
    if (!IsPid(entry->d_name)) continue;
    const std::string process = absl::StrCat(proc, "/", entry->d_name);
    std::set<uint32_t> its;
    AddProcessUids(process + "/status", range, &its);
    if (its.empty()) continue;  // the cgroup file only of processes in the range
    all->insert(its.begin(), its.end());
    if (job_id.empty() || !InRankCgroupOfJob(ReadFile(process + "/cgroup"), job_id)) {
      outside_job->insert(its.begin(), its.end());
    }
  }
  closedir(dir);
}

}  // namespace

std::set<uint32_t> UidsInUse(const UidRange& range, const std::string& proc,
                             const std::string& except_ranks_of) {
  std::set<uint32_t> all, outside_job;
  ScanUids(range, proc, except_ranks_of, &all, &outside_job);
  return outside_job;
}

bool InRankCgroupOfJob(std::string_view cgroups, std::string_view job_id) {
  if (job_id.empty()) return false;
  while (!cgroups.empty()) {
    const size_t newline = cgroups.find('\n');
    const std::string_view line = cgroups.substr(0, newline);
    cgroups = newline == std::string_view::npos ? "" : cgroups.substr(newline + 1);
    // "hierarchy-ID:controllers:path"; the path is the rest of the line. Its last component
    // must be the rank's, and the one before it an agent's directory.
    const size_t first = line.find(':');
    const size_t second = first == std::string_view::npos ? first : line.find(':', first + 1);
    if (second == std::string_view::npos) continue;
    std::string_view path = line.substr(second + 1);
    while (!path.empty() && path.back() == '/') path.remove_suffix(1);
    const size_t last = path.rfind('/');
    if (last == std::string_view::npos) continue;
    const std::string_view parent = path.substr(0, last);
    const std::string_view agent = parent.substr(parent.rfind('/') + 1);
    if (agent.substr(0, kAgentCgroupPrefix.size()) == kAgentCgroupPrefix &&
        IsRankCgroupOf(path.substr(last + 1), job_id)) {
      return true;
    }
  }
  return false;
}

RankIdentity JobIdentity(const RankIdentity& node, uint32_t uid) {
  if (!node.switch_user) return node;
  RankIdentity identity;
  identity.switch_user = true;
  identity.name = absl::StrCat("gradhub-job-", uid);
  identity.uid = uid;
  identity.gid = uid;
  // The node's rank group too, so what the node shares with its ranks (the trainer, data roots
  // readable by gradhub-rank's group) stays readable; the job's own group keeps its code to
  // itself.
  if (node.gid != 0) identity.supplementary_gids = {node.gid};
  return identity;
}

absl::StatusOr<uint32_t> JobUids::Acquire(const std::string& job_id,
                                          std::set<std::string> active_jobs) {
  active_jobs.insert(job_id);
  std::set<uint32_t> in_use, in_use_by_others;
  ScanUids(range_, proc_, job_id, &in_use, &in_use_by_others);
  std::vector<std::pair<std::string, uint32_t>> released;  // job, uid
  absl::StatusOr<uint32_t> uid;
  {
    absl::MutexLock lock(&mu_);
    for (const uint32_t free : ReleasableUids(holders_, active_jobs, in_use)) {  // rule 4
      released.emplace_back(holders_[free], free);
      holders_.erase(free);
    }
    // Given to root before any job can get the uid: the lock is held until it is.
    for (const auto& [job, uid] : released) {
      if (disown_) disown_(job, uid);
    }
    uid = ChooseJobUid(job_id, range_, holders_, in_use_by_others);  // rules 1 to 3
    if (uid.ok()) holders_[*uid] = job_id;
  }
  return uid;
}

std::map<uint32_t, std::string> JobUids::Holders() const {
  absl::MutexLock lock(&mu_);
  return holders_;
}

void DisownJobFiles(const std::vector<std::string>& dirs) {
  for (const std::string& dir : dirs) {
    std::error_code error;
    if (!std::filesystem::exists(dir, error)) continue;
    auto disown = [](const std::filesystem::path& path) {
      if (lchown(path.c_str(), 0, 0) != 0) {
        std::cerr << "gradhub-agent: cannot give " << path << " to root: " << std::strerror(errno)
                  << "\n";
      }
    };
    disown(dir);
    for (auto it = std::filesystem::recursive_directory_iterator(
             dir, std::filesystem::directory_options::skip_permission_denied, error);
         !error && it != std::filesystem::recursive_directory_iterator(); it.increment(error)) {
      disown(it->path());
    }
  }
}

int RemoveSharedMemoryLeftovers(const std::string& directory,
                                const std::function<bool(uint32_t owner)>& released) {
  DIR* dir = opendir(directory.c_str());
  if (dir == nullptr) return 0;  // no /dev/shm here: nothing was left in it
  int removed = 0;
  while (const dirent* entry = readdir(dir)) {
    if (std::string_view(entry->d_name).substr(0, kSharedMemoryFilePrefix.size()) !=
        kSharedMemoryFilePrefix) {
      continue;
    }
    struct stat st {};
    // Not followed: a link is not ours to judge, and its target is never removed.
    if (fstatat(dirfd(dir), entry->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode) ||
        !released(st.st_uid)) {
      continue;
    }
    if (unlinkat(dirfd(dir), entry->d_name, 0) == 0) {
      ++removed;
    } else {
      std::cerr << "gradhub-agent: cannot remove " << directory << "/" << entry->d_name << ": "
                << std::strerror(errno) << "\n";
    }
  }
  closedir(dir);
  return removed;
}

}  // namespace gradhub::agent
