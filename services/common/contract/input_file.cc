#include "services/common/contract/input_file.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>

#include "services/common/contract/data_paths.h"
#include "services/common/contract/user_error.h"

namespace gradhub {
namespace {

InputPolicy& MutablePolicy() {
  static InputPolicy* policy = new InputPolicy();
  return *policy;
}

std::string Resolve(const std::string& path) {
  char resolved[PATH_MAX];
  if (realpath(path.c_str(), resolved) == nullptr) return "";
  return resolved;
}

std::string SizeLimitMessage(const std::string& path, int64_t size, int64_t max_bytes) {
  return path + " is " + std::to_string(size) + " bytes, more than this node accepts (" +
         std::to_string(max_bytes) + " bytes, gradhub-agent --max-input-bytes)";
}

// What kind of non-regular file `mode` is, for the message.
std::string KindOf(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISCHR(mode) || S_ISBLK(mode)) return "a device";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

bool PseudoFilesystem(int64_t type) {
  switch (type) {
    case PROC_SUPER_MAGIC:
    case SYSFS_MAGIC:
    case DEBUGFS_MAGIC:
    case SECURITYFS_MAGIC:
    case CGROUP_SUPER_MAGIC:
    case CGROUP2_SUPER_MAGIC:
    case TRACEFS_MAGIC:
    case BPF_FS_MAGIC:
      return true;
    default:
      return false;
  }
}

// The roots as the kernel sees them; a root that does not exist (any more) serves nothing.
std::vector<std::string> ResolvedRoots(const InputPolicy& policy) {
  std::vector<std::string> roots;
  for (const std::string& root : policy.data_roots) {
    if (std::string resolved = Resolve(root); !resolved.empty()) roots.push_back(resolved);
  }
  return roots;
}

// Steps 1 and 2; "" when fine.
std::string CheckSpelledAndResolved(const std::string& path, const std::string& field,
                                    const InputPolicy& policy, std::string* resolved) {
  if (policy.enforce_roots) {
    if (std::string problem = PathProblem({field, path}, policy.data_roots); !problem.empty()) {
      return problem;
    }
  }
  *resolved = Resolve(path);
  if (resolved->empty()) return field + ": cannot open " + path + ": " + std::strerror(errno);
  if (policy.enforce_roots && !IsUnderAnyRoot(*resolved, ResolvedRoots(policy))) {
    return field + ": " + path + " leads out of the data roots through a symbolic link (allowed: " +
           DescribeRoots(policy.data_roots) + ")";
  }
  return "";
}

// Step 4 on a stat result; "" when fine.
std::string CheckKindAndSize(const std::string& path, const std::string& field,
                             const struct stat& info, int64_t fs_type, const InputPolicy& policy) {
  if (!S_ISREG(info.st_mode)) {
    return field + ": " + path + " is " + KindOf(info.st_mode) + "; only regular files are read";
  }
  if (PseudoFilesystem(fs_type)) {
    return field + ": " + path + " is on a kernel pseudo filesystem; only regular files are read";
  }
  if (info.st_size > policy.max_bytes) {
    return field + ": " + SizeLimitMessage(path, info.st_size, policy.max_bytes);
  }
  return "";
}

}  // namespace

void SetInputPolicy(InputPolicy policy) { MutablePolicy() = std::move(policy); }

const InputPolicy& CurrentInputPolicy() { return MutablePolicy(); }

InputFile::~InputFile() {
  if (fd_ >= 0) close(fd_);
}

int InputFile::Release() {
  const int fd = fd_;
  fd_ = -1;
  return fd;
}

InputFile OpenInputFile(const std::string& path, const std::string& field,
                        const InputPolicy& policy) {
  std::string resolved;
  if (std::string problem = CheckSpelledAndResolved(path, field, policy, &resolved);
      !problem.empty()) {
    throw UserError("", problem);
  }
  const int fd = open(resolved.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (fd < 0) throw UserError(field, "cannot open " + path + ": " + std::strerror(errno));
  InputFile file(fd, 0);
  struct stat info;
  struct statfs fs;
  if (fstat(fd, &info) != 0 || fstatfs(fd, &fs) != 0) {
    throw UserError(field, "cannot stat " + path + ": " + std::strerror(errno));
  }
  if (std::string problem = CheckKindAndSize(path, field, info, fs.f_type, policy);
      !problem.empty()) {
    throw UserError("", problem);
  }
  if (policy.enforce_roots) {
    const std::string opened = Resolve("/proc/self/fd/" + std::to_string(fd));
    if (opened.empty() || !IsUnderAnyRoot(opened, ResolvedRoots(policy))) {
      throw UserError(field, path +
                                 " changed while it was opened and now leads out of the "
                                 "data roots; refused");
    }
  }
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return InputFile(file.Release(), info.st_size);
}

std::string CheckInputPath(const std::string& path, const std::string& field,
                           const InputPolicy& policy) {
  std::string resolved;
  if (std::string problem = CheckSpelledAndResolved(path, field, policy, &resolved);
      !problem.empty()) {
    return problem;
  }
  struct stat info;
  struct statfs fs;
  if (stat(resolved.c_str(), &info) != 0 || statfs(resolved.c_str(), &fs) != 0) {
    return field + ": cannot stat " + path + ": " + std::strerror(errno);
  }
  return CheckKindAndSize(path, field, info, fs.f_type, policy);
}

std::string ReadAllBounded(InputFile& file, const std::string& field, const InputPolicy& policy) {
  std::string contents;
  contents.reserve(static_cast<size_t>(std::min<int64_t>(file.size(), policy.max_bytes)));
  char buffer[1 << 16];
  for (;;) {
    const ssize_t n = read(file.fd(), buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw UserError(field, std::string("read failed: ") + std::strerror(errno));
    if (n == 0) return contents;
    if (static_cast<int64_t>(contents.size()) + n > policy.max_bytes) {
      throw UserError(field, "the file grew past this node's limit of " +
                                 std::to_string(policy.max_bytes) + " bytes while it was read");
    }
    contents.append(buffer, static_cast<size_t>(n));
  }
}

}  // namespace gradhub
