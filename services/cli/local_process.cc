#include "services/cli/local_process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/close_range.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

extern char** environ;

namespace gradhub::cli {
namespace {

std::string ReadWhole(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// argv and envp as execve takes them, built before fork: the child of a process that may
// have threads should only call async-signal-safe functions.
struct ExecArgs {
  std::vector<std::string> storage_argv, storage_env;
  std::vector<char*> argv, envp;

  explicit ExecArgs(const ProcessSpec& spec) : storage_argv(spec.argv) {
    for (char** entry = environ; *entry != nullptr; ++entry) {
      const std::string text = *entry;
      if (spec.env.count(text.substr(0, text.find('='))) == 0) storage_env.push_back(text);
    }
    for (const auto& [key, value] : spec.env) storage_env.push_back(key + "=" + value);
    for (std::string& arg : storage_argv) argv.push_back(arg.data());
    argv.push_back(nullptr);
    for (std::string& entry : storage_env) envp.push_back(entry.data());
    envp.push_back(nullptr);
  }
};

// In the child: stdin from /dev/null, stdout and stderr to the given descriptors, nothing
// else open, then exec. Never returns.
[[noreturn]] void ExecChild(const ExecArgs& args, int out, int err) {
  const int null = open("/dev/null", O_RDONLY);
  if (null < 0 || out < 0 || err < 0) _exit(126);
  dup2(null, 0);
  dup2(out, 1);
  dup2(err, 2);
  // Our pipes and sockets (a caller's `$(gradhub cluster up)` above all) must not live on in
  // a service, or that caller would wait for the service to end.
  syscall(SYS_close_range, 3, ~0U, 0);
  execve(args.argv[0], args.argv.data(), args.envp.data());
  const char message[] = "gradhub cluster: exec failed\n";
  (void)!write(2, message, sizeof(message) - 1);
  _exit(127);
}

}  // namespace

absl::StatusOr<pid_t> SpawnDetached(const ProcessSpec& spec, const std::string& log) {
  std::rename(log.c_str(), (log + ".1").c_str());  // none yet is fine
  const ExecArgs args(spec);
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
  if (pid == 0) {
    setsid();
    const int out = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    ExecChild(args, out, out);
  }
  return pid;
}

absl::StatusOr<int> RunToCompletion(const ProcessSpec& spec, const std::string& out_file,
                                    const std::string& err_file) {
  const ExecArgs args(spec);
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
  if (pid == 0) {
    const int out = open(out_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    const int err = open(err_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ExecChild(args, out, err);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return absl::InternalError(absl::StrCat("waitpid: ", strerror(errno)));
  }
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return WEXITSTATUS(status);
}

bool IsAlive(pid_t pid) {
  if (pid <= 0 || (kill(pid, 0) != 0 && errno != EPERM)) return false;
  // A zombie answers kill(0) but is gone; its state follows the last ')' of /proc/PID/stat.
  const std::string stat = ReadWhole(absl::StrCat("/proc/", pid, "/stat"));
  const size_t paren = stat.rfind(')');
  return paren == std::string::npos || paren + 2 >= stat.size() || stat[paren + 2] != 'Z';
}

std::vector<std::string> CommandLine(pid_t pid) {
  const std::string text = ReadWhole(absl::StrCat("/proc/", pid, "/cmdline"));
  if (text.empty()) return {};
  return absl::StrSplit(text.substr(0, text.size() - (text.back() == '\0' ? 1 : 0)), '\0');
}

bool IsClusterProcess(pid_t pid, const std::string& binary, const std::string& state_dir) {
  if (!IsAlive(pid)) return false;
  const std::vector<std::string> command = CommandLine(pid);
  if (command.empty() || command[0] != binary) return false;
  const std::string environment = ReadWhole(absl::StrCat("/proc/", pid, "/environ"));
  const std::string marker = absl::StrCat(kClusterMarker, "=", state_dir);
  for (absl::string_view entry : absl::StrSplit(environment, '\0')) {
    if (entry == marker) return true;
  }
  return false;
}

std::string TailOfFile(const std::string& path, int lines) {
  const std::string text = ReadWhole(path);
  size_t start = text.size();
  if (start > 0 && text[start - 1] == '\n') --start;  // the last line's own newline
  for (int seen = 0; start > 0; --start) {
    if (text[start - 1] == '\n' && ++seen == lines) break;
  }
  return text.substr(start);
}

absl::StatusOr<std::map<std::string, std::string>> WaitForLogLines(
    pid_t pid, const std::string& log, const std::vector<std::string>& markers,
    absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    const std::string text = ReadWhole(log);
    std::map<std::string, std::string> found;
    for (const std::string& marker : markers) {
      const size_t at = text.find(marker);
      const size_t end = at == std::string::npos ? at : text.find('\n', at);
      if (end == std::string::npos) break;  // absent, or its line not complete yet
      found[marker] = text.substr(at + marker.size(), end - at - marker.size());
    }
    if (found.size() == markers.size()) return found;
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid || !IsAlive(pid)) {
      return absl::UnavailableError(absl::StrCat("it exited before it was ready; the end of ", log,
                                                 ":\n", TailOfFile(log, 15)));
    }
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "not ready after ", absl::FormatDuration(timeout), " (no '",
          absl::StrJoin(markers, "', '"), "' in ", log, "); its end:\n", TailOfFile(log, 15)));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

absl::StatusOr<int> FreeLoopbackPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  const bool ok = fd >= 0 &&
                  bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0 &&
                  getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0;
  if (fd >= 0) close(fd);
  if (!ok) return absl::UnavailableError("no free loopback port");
  return ntohs(address.sin_port);
}

std::string RandomHex(int bytes) {
  std::ifstream random("/dev/urandom", std::ios::binary);
  std::string out;
  for (int i = 0; i < bytes; ++i) {
    absl::StrAppendFormat(&out, "%02x", static_cast<unsigned char>(random.get()));
  }
  return out;
}

}  // namespace gradhub::cli
