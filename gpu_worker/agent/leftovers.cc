#include "gpu_worker/agent/leftovers.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"

namespace gradhub::agent {
namespace {

// The fields of /proc/PID/stat after "(comm)", which may itself contain spaces and ')'.
std::optional<std::vector<std::string>> StatFieldsAfterComm(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  if (!in) return std::nullopt;
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t close = text.rfind(')');
  if (close == std::string::npos) return std::nullopt;
  std::vector<std::string> fields =
      absl::StrSplit(text.substr(close + 1), ' ', absl::SkipWhitespace());
  return fields;  // fields[0] is field 3 (state)
}

}  // namespace

std::optional<uint64_t> ProcessStartTime(pid_t pid) {
  auto fields = StatFieldsAfterComm(pid);
  constexpr size_t kStartTime = 22 - 3;
  uint64_t start = 0;
  if (!fields || fields->size() <= kStartTime || !absl::SimpleAtoi((*fields)[kStartTime], &start)) {
    return std::nullopt;
  }
  return start;
}

bool ProcessGone(pid_t pid) {
  if (kill(pid, 0) != 0 && errno == ESRCH) return true;
  auto fields = StatFieldsAfterComm(pid);
  if (!fields) return true;
  return !fields->empty() && ((*fields)[0] == "Z" || (*fields)[0] == "X");
}

std::string BootId() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(in, id);
  return std::string(absl::StripAsciiWhitespace(id));
}

bool WritePidFile(const std::string& path, pid_t pid) {
  const auto start = ProcessStartTime(pid);
  if (!start) return false;
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << pid << " " << *start << " " << BootId() << "\n";
    out.flush();
    if (!out) return false;
  }
  std::error_code error;
  std::filesystem::rename(tmp, path, error);
  return !error;
}

LeftoverReport KillLeftovers(const std::string& dir) {
  LeftoverReport report;
  std::error_code error;
  if (!std::filesystem::is_directory(dir, error)) return report;
  const std::string boot_id = BootId();
  for (const auto& entry : std::filesystem::directory_iterator(dir, error)) {
    const std::string path = entry.path().string();
    if (entry.path().extension() != ".pid") {
      // A ".pid.tmp" is a file whose writer died before the rename; its process (if it got
      // that far) had PR_SET_PDEATHSIG set before the agent could die.
      if (absl::EndsWith(path, ".pid.tmp")) std::filesystem::remove(path, error);
      continue;
    }
    ++report.files;
    std::ifstream in(path);
    int64_t pid = 0;
    uint64_t start = 0;
    std::string recorded_boot;
    in >> pid >> start >> recorded_boot;
    const bool same = in && pid > 1 && recorded_boot == boot_id &&
                      ProcessStartTime(static_cast<pid_t>(pid)) == start;
    if (same) {
      // The rank made itself a group leader (rank_process.h); kill the group, which takes
      // whatever it spawned. If it is not a group leader, only the process itself is ours.
      if (kill(-static_cast<pid_t>(pid), SIGKILL) != 0) kill(static_cast<pid_t>(pid), SIGKILL);
      ++report.killed;
    } else {
      ++report.skipped;
    }
    std::filesystem::remove(path, error);
  }
  return report;
}

}  // namespace gradhub::agent
