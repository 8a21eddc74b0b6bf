#include "gpu_worker/agent/rank_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <future>
#include <iostream>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gpu_worker/agent/leftovers.h"
#include "services/common/contract/progress_record.h"
#include "services/common/text_rules.h"

extern char** environ;

namespace gradhub::agent {

const char* RankStateName(RankState state) {
  switch (state) {
    case RankState::kStarting:
      return "STARTING";
    case RankState::kRunning:
      return "RUNNING";
    case RankState::kSucceeded:
      return "SUCCEEDED";
    case RankState::kFailed:
      return "FAILED";
    case RankState::kStopped:
      return "STOPPED";
  }
  return "?";
}

// ------------------------------------------------------------------------------------------
// UTF-8

namespace {

constexpr char kReplacement[] = "\xEF\xBF\xBD";  // U+FFFD

}  // namespace

std::vector<std::string> SanitizeAndSplitLine(const std::string& raw, size_t max_bytes) {
  max_bytes = std::max<size_t>(max_bytes, 4);
  std::vector<std::string> pieces;
  std::string current;
  for (size_t i = 0; i < raw.size();) {
    const size_t length = Utf8SequenceLength(raw, i);
    const size_t out_length = length == 0 ? 3 : length;
    if (current.size() + out_length > max_bytes) {
      pieces.push_back(std::move(current));
      current.clear();
    }
    if (length == 0) {
      current += kReplacement;
      i += 1;
    } else {
      current.append(raw, i, length);
      i += length;
    }
  }
  if (!current.empty() || pieces.empty()) pieces.push_back(std::move(current));
  return pieces;
}

// ------------------------------------------------------------------------------------------
// The child's state, shared by the RankProcess handle and the supervisor thread.

struct RankProcess::Child {
  pid_t pid = 0;
  std::string pid_file;
  std::shared_ptr<MemoryCgroup> cgroup;  // supervisor thread only once spawned

  // Supervisor thread only.
  int fds[2] = {-1, -1};  // stdout, stderr read ends; -1 once closed
  std::string partial[2];
  int64_t next_seq = 1;
  // The last stderr lines kept for status.last_stderr_line (options.message_lines of them).
  std::deque<std::string> stderr_tail;
  size_t message_lines = 1;
  bool reaped = false;
  int wait_status = 0;
  bool exit_unknown = false;
  bool stopped_by_agent = false;
  absl::Time drain_deadline = absl::InfiniteFuture();

  // Guarded by mu.
  mutable std::mutex mu;
  mutable std::condition_variable exited_cv;
  RankProcessStatus status;
  // Once true the pid may belong to another process: nothing may signal it any more.
  bool reaped_locked = false;
  bool stop_requested = false;
  bool kill_sent = false;
  absl::Time kill_deadline = absl::InfiniteFuture();

  // Guarded by sink_mu, held while the callback runs so the destructor can wait it out.
  std::mutex sink_mu;
  LineCallback on_line;

  // Requires mu. SIGKILL to the group unless reaped.
  void KillLocked() {
    if (reaped_locked || kill_sent) return;
    kill(-pid, SIGKILL);
    kill_sent = true;
  }
};

namespace {

using Child = RankProcess::Child;

// Everything an exec needs, built before fork: after fork only async-signal-safe calls.
struct ExecPlan {
  std::vector<std::string> argv_storage, env_storage;
  std::vector<char*> argv, envp;
  std::string working_dir;
  std::string exec_error, chdir_error;  // messages written to stderr on failure
  // Built here too: constructing a std::string after fork would call malloc.
  std::string cgroup_error = "gradhub-agent: cannot join the rank's memory cgroup: errno ";
  std::string rlimit_error = "gradhub-agent: cannot set RLIMIT_DATA: errno ";
  std::string drop_error = "gradhub-agent: cannot drop privileges to the rank's user: errno ";
  int cgroup_procs_fd = -1;
  int64_t rlimit_data_bytes = 0;
  RankIdentity identity;
};

}  // namespace

bool RankInheritsVariable(std::string_view name) {
  static constexpr std::string_view kNames[] = {"PATH",
                                                "LD_LIBRARY_PATH",
                                                "LANG",
                                                "LANGUAGE",
                                                "TZ",
                                                "TMPDIR",
                                                "GRADHUB_THREADS",
                                                "GRADHUB_COLLECTIVE_TIMEOUT",
                                                "GRADHUB_PREEMPT_GRACE"};
  static constexpr std::string_view kPrefixes[] = {"LC_",   "OMP_",  "MKL_",  "OPENBLAS_",
                                                   "CUDA_", "NCCL_", "GLOO_", "TORCH_"};
  for (std::string_view allowed : kNames) {
    if (name == allowed) return true;
  }
  for (std::string_view prefix : kPrefixes) {
    if (name.substr(0, prefix.size()) == prefix) return true;
  }
  return false;
}

namespace {

ExecPlan MakePlan(const RankProcessOptions& options) {
  ExecPlan plan;
  plan.argv_storage = options.argv;
  std::map<std::string, std::string> env;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    const char* eq = std::strchr(*entry, '=');
    if (eq == nullptr || !RankInheritsVariable(std::string_view(*entry, eq - *entry))) continue;
    env[std::string(*entry, eq - *entry)] = eq + 1;
  }
  for (const auto& [key, value] : options.env) env[key] = value;
  for (const auto& [key, value] : env) plan.env_storage.push_back(key + "=" + value);
  for (auto& arg : plan.argv_storage) plan.argv.push_back(arg.data());
  plan.argv.push_back(nullptr);
  for (auto& entry : plan.env_storage) plan.envp.push_back(entry.data());
  plan.envp.push_back(nullptr);
  plan.working_dir = options.working_dir;
  plan.exec_error = "gradhub-agent: cannot exec " + options.argv[0] + ": errno ";
  plan.chdir_error = "gradhub-agent: cannot chdir to " + options.working_dir + ": errno ";
  plan.cgroup_procs_fd = options.memory_cgroup ? options.memory_cgroup->procs_fd() : -1;
  plan.rlimit_data_bytes = options.rlimit_data_bytes;
  plan.identity = options.identity;
  return plan;
}

// Async-signal-safe: writes `message`, errno in decimal and a newline to fd 2.
void WriteErrno(const std::string& message, int error) {
  char digits[16];
  int n = 0;
  do {
    digits[sizeof(digits) - 1 - n++] = static_cast<char>('0' + error % 10);
    error /= 10;
  } while (error > 0 && n < 15);
  ssize_t ignored = write(2, message.data(), message.size());
  ignored = write(2, digits + sizeof(digits) - n, n);
  ignored = write(2, "\n", 1);
  (void)ignored;
}

// Step 2: writes our pid, in decimal, to the cgroup's cgroup.procs.
bool JoinCgroup(int procs_fd) {
  char digits[16];
  int n = 0;
  for (pid_t pid = getpid(); n < 15 && (n == 0 || pid > 0); pid /= 10) {
    digits[sizeof(digits) - 1 - n++] = static_cast<char>('0' + pid % 10);
  }
  return write(procs_fd, digits + sizeof(digits) - n, n) == n;
}

// Step 5. Raw syscalls: they change this (the only) thread's credentials without glibc's
// all-threads broadcast. False (errno set) when any step fails or root could be regained.
bool DropPrivileges(const RankIdentity& identity) {
  const uid_t uid = identity.uid;
  const gid_t gid = identity.gid;
  if (syscall(SYS_setgroups, identity.supplementary_gids.size(),
              identity.supplementary_gids.empty() ? nullptr : identity.supplementary_gids.data()) !=
      0) {
    return false;
  }
  if (syscall(SYS_setresgid, gid, gid, gid) != 0) return false;
  if (syscall(SYS_setresuid, uid, uid, uid) != 0) return false;
  uid_t ruid, euid, suid;
  gid_t rgid, egid, sgid;
  if (getresuid(&ruid, &euid, &suid) != 0 || getresgid(&rgid, &egid, &sgid) != 0) return false;
  if (ruid != uid || euid != uid || suid != uid || rgid != gid || egid != gid || sgid != gid) {
    errno = EPERM;
    return false;
  }
  if (syscall(SYS_setresuid, 0, 0, 0) == 0) {  // must be impossible now
    errno = EPERM;
    return false;
  }
  return prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0;
}

void ResetSignals() {
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  struct sigaction dfl;
  std::memset(&dfl, 0, sizeof(dfl));
  dfl.sa_handler = SIG_DFL;
  for (int sig = 1; sig < NSIG; ++sig) {
    if (sig != SIGKILL && sig != SIGSTOP) sigaction(sig, &dfl, nullptr);
  }
}

// In the child, between fork and exec: the launch protocol of rank_process.h. Never returns.
[[noreturn]] void ExecChild(const ExecPlan& plan, pid_t parent, int stdin_fd, int out_fd,
                            int err_fd) {
  setpgid(0, 0);                                                                     // 1
  const bool joined = plan.cgroup_procs_fd < 0 || JoinCgroup(plan.cgroup_procs_fd);  // 2
  const int join_errno = errno;
  ResetSignals();  // 3
  dup2(stdin_fd, 0);
  dup2(out_fd, 1);
  dup2(err_fd, 2);
  // Whatever else the agent has open (gRPC sockets, other ranks' pipes) stays out.
  close_range(3, UINT_MAX, CLOSE_RANGE_CLOEXEC);
  if (!joined) {  // reported only now that stderr is the rank's pipe
    WriteErrno(plan.cgroup_error, join_errno);
    _exit(127);
  }
  if (plan.rlimit_data_bytes > 0) {  // 4
    const struct rlimit limit = {static_cast<rlim_t>(plan.rlimit_data_bytes),
                                 static_cast<rlim_t>(plan.rlimit_data_bytes)};
    if (setrlimit(RLIMIT_DATA, &limit) != 0) {
      WriteErrno(plan.rlimit_error, errno);
      _exit(127);
    }
  }
  const struct rlimit back_to_normal_priority = {kRankNiceLimit, kRankNiceLimit};
  setrlimit(RLIMIT_NICE, &back_to_normal_priority);  // 4: where the agent may; else as it is
  if (plan.identity.switch_user && !DropPrivileges(plan.identity)) {  // 5
    WriteErrno(plan.drop_error, errno);
    _exit(127);
  }
  prctl(PR_SET_PDEATHSIG, SIGKILL);  // 6
  // The agent may have died before prctl: then no signal will ever come.
  if (getppid() != parent) _exit(127);
  if (!plan.working_dir.empty() && chdir(plan.working_dir.c_str()) != 0) {  // 7
    WriteErrno(plan.chdir_error, errno);
    _exit(127);
  }
  execve(plan.argv[0], plan.argv.data(), plan.envp.data());  // 8
  WriteErrno(plan.exec_error, errno);
  _exit(127);
}

// The step of a trainer's progress record (any of its events), or nullopt for other lines.
std::optional<int64_t> ProgressStep(const std::string& text) {
  const std::optional<ProgressRecord> record = ParseProgressRecord(text);
  if (!record) return std::nullopt;
  return record->step;
}

// The process-wide forking, reading and reaping thread (see rank_process.h). Created on first
// use and deliberately never destroyed: its thread must outlive every child.
class Supervisor {
 public:
  static Supervisor& Get() {
    static Supervisor* supervisor = new Supervisor();
    return *supervisor;
  }

  absl::StatusOr<std::shared_ptr<Child>> Spawn(RankProcessOptions options) {
    if (std::this_thread::get_id() == thread_.get_id()) {
      return absl::FailedPreconditionError("RankProcess::Start called from a LineCallback");
    }
    auto request = std::make_shared<Request>();
    request->options = std::move(options);
    auto result = request->result.get_future();
    {
      std::lock_guard<std::mutex> lock(mu_);
      requests_.push_back(request);
    }
    Wake();
    return result.get();
  }

  void Wake() {
    const uint64_t one = 1;
    ssize_t ignored = write(wake_fd_, &one, sizeof(one));
    (void)ignored;
  }

 private:
  struct Request {
    RankProcessOptions options;
    std::promise<absl::StatusOr<std::shared_ptr<Child>>> result;
  };

  Supervisor() : wake_fd_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)), thread_([this] { Loop(); }) {}

  absl::StatusOr<std::shared_ptr<Child>> DoSpawn(RankProcessOptions& options) {
    if (options.argv.empty() || options.argv[0].empty()) {
      return absl::InvalidArgumentError("RankProcess: empty argv");
    }
    ExecPlan plan = MakePlan(options);
    int out[2], err[2];
    if (pipe2(out, O_CLOEXEC) != 0) {
      return absl::ResourceExhaustedError(absl::StrCat("pipe: ", std::strerror(errno)));
    }
    if (pipe2(err, O_CLOEXEC) != 0) {
      close(out[0]);
      close(out[1]);
      return absl::ResourceExhaustedError(absl::StrCat("pipe: ", std::strerror(errno)));
    }
    const int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
    const pid_t parent = getpid();
    const pid_t pid = fork();
    if (pid == 0) ExecChild(plan, parent, devnull, out[1], err[1]);
    const int fork_errno = errno;
    close(out[1]);
    close(err[1]);
    if (devnull >= 0) close(devnull);
    if (pid < 0) {
      close(out[0]);
      close(err[0]);
      return absl::ResourceExhaustedError(absl::StrCat("fork: ", std::strerror(fork_errno)));
    }
    // Also in the parent, so that a Stop() right after Start() finds the group.
    setpgid(pid, pid);
    auto child = std::make_shared<Child>();
    child->pid = pid;
    child->status.pid = pid;
    child->fds[0] = out[0];
    child->fds[1] = err[0];
    fcntl(out[0], F_SETFL, O_NONBLOCK);
    fcntl(err[0], F_SETFL, O_NONBLOCK);
    child->on_line = std::move(options.on_line);
    child->message_lines = std::max(1, options.message_lines);
    child->pid_file = options.pid_file;
    child->status.memory_limit_bytes =
        options.memory_cgroup ? options.memory_cgroup->limit_bytes() : options.rlimit_data_bytes;
    child->cgroup = std::move(options.memory_cgroup);
    if (!child->pid_file.empty() && !WritePidFile(child->pid_file, pid)) {
      std::cerr << "gradhub-agent: cannot write pid file " << child->pid_file << "\n";
    }
    children_.push_back(child);
    return child;
  }

  // The newest `message_lines` stderr lines, one a line, at most kMaxMessageBytes: the
  // oldest lines go first, the newest is cut if it alone is too long.
  static std::string StderrTail(Child& child, const std::string& line) {
    child.stderr_tail.push_back(SanitizeAndSplitLine(line, kMaxMessageBytes)[0]);
    size_t bytes = 0;
    for (const std::string& kept : child.stderr_tail) bytes += kept.size() + 1;
    while (child.stderr_tail.size() > 1 &&
           (child.stderr_tail.size() > child.message_lines || bytes - 1 > kMaxMessageBytes)) {
      bytes -= child.stderr_tail.front().size() + 1;
      child.stderr_tail.pop_front();
    }
    return absl::StrJoin(child.stderr_tail, "\n");
  }

  void EmitLine(Child& child, int stream, const std::string& raw) {
    for (std::string& text : SanitizeAndSplitLine(raw)) {
      OutputLine line;
      line.stream = stream == 0 ? OutputStream::kStdout : OutputStream::kStderr;
      line.seq = child.next_seq++;
      line.time = absl::Now();
      line.text = std::move(text);
      const std::optional<int64_t> step = stream == 0 ? ProgressStep(line.text) : std::nullopt;
      if (step || (stream == 1 && !line.text.empty())) {
        std::lock_guard<std::mutex> lock(child.mu);
        if (step) {
          child.status.last_step = std::max(child.status.last_step, *step);
          child.status.last_step_time = line.time;
          if (child.status.state == RankState::kStarting) child.status.state = RankState::kRunning;
        } else {
          child.status.last_stderr_line = StderrTail(child, line.text);
        }
      }
      std::lock_guard<std::mutex> lock(child.sink_mu);
      if (child.on_line) child.on_line(line);
    }
  }

  // Reads what is there (at most one buffer per call, for fairness between children).
  void ReadFrom(Child& child, int stream) {
    char buffer[64 * 1024];
    const ssize_t n = read(child.fds[stream], buffer, sizeof(buffer));
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    std::string& partial = child.partial[stream];
    if (n <= 0) {  // EOF (or a read error, which is treated the same)
      close(child.fds[stream]);
      child.fds[stream] = -1;
      if (!partial.empty()) EmitLine(child, stream, partial);
      partial.clear();
      return;
    }
    partial.append(buffer, n);
    size_t start = 0;
    for (;;) {
      const size_t newline = partial.find('\n', start);
      if (newline != std::string::npos) {
        EmitLine(child, stream, partial.substr(start, newline - start));
        start = newline + 1;
        continue;
      }
      if (partial.size() - start < kMaxLineBytes) break;
      // A line longer than the limit: cut it, though not inside a UTF-8 sequence.
      size_t cut = start + kMaxLineBytes;
      for (int back = 0; back < 3 && (static_cast<unsigned char>(partial[cut]) & 0xC0) == 0x80;
           ++back) {
        --cut;
      }
      if ((static_cast<unsigned char>(partial[cut]) & 0xC0) == 0x80) cut = start + kMaxLineBytes;
      EmitLine(child, stream, partial.substr(start, cut - start));
      start = cut;
    }
    partial.erase(0, start);
  }

  // Once the leader is reaped: whether the kernel OOM-killed the rank, its peak, then every
  // process still in the cgroup is killed (one that left the process group is still in it)
  // and the cgroup removed (retried by Tick while that takes).
  void ReadAndRemoveCgroup(Child& child) {
    if (!child.cgroup) return;
    const bool oom = child.cgroup->OomKills() > 0;
    const int64_t peak = child.cgroup->PeakBytes();
    child.cgroup->KillAll();
    {
      std::lock_guard<std::mutex> lock(child.mu);
      child.status.out_of_memory = oom;
      child.status.memory_peak_bytes = peak;
    }
    if (child.cgroup->Remove()) child.cgroup.reset();
  }

  // Kill deadlines, reaping and the end of draining. True when the child is finished with.
  bool Tick(Child& child, absl::Time now) {
    if (!child.reaped) {
      {
        std::lock_guard<std::mutex> lock(child.mu);
        if (child.stop_requested && now >= child.kill_deadline) child.KillLocked();
      }
      siginfo_t info;
      std::memset(&info, 0, sizeof(info));
      // WNOWAIT: the zombie keeps the pid (and so the group id) from being reused while the
      // rest of the group is killed.
      const int waited = waitid(P_PID, child.pid, &info, WEXITED | WNOHANG | WNOWAIT);
      if (waited != 0 && errno == ECHILD) {
        // Reaped behind our back (SIGCHLD set to SIG_IGN somewhere): the status is lost.
        child.reaped = true;
        child.exit_unknown = true;
      } else if (waited == 0 && info.si_pid == child.pid) {
        kill(-child.pid, SIGKILL);
        waitpid(child.pid, &child.wait_status, 0);
        child.reaped = true;
      }
      if (child.reaped) {
        if (!child.pid_file.empty()) unlink(child.pid_file.c_str());
        ReadAndRemoveCgroup(child);
        child.drain_deadline = now + kDrainTimeout;
        std::lock_guard<std::mutex> lock(child.mu);
        child.reaped_locked = true;
        child.stopped_by_agent = child.stop_requested;
      }
    }
    if (!child.reaped) return false;
    if (child.cgroup && child.cgroup->Remove()) child.cgroup.reset();
    if ((child.fds[0] >= 0 || child.fds[1] >= 0) && now < child.drain_deadline) return false;
    for (int stream = 0; stream < 2; ++stream) {
      if (child.fds[stream] >= 0) {
        close(child.fds[stream]);
        child.fds[stream] = -1;
      }
      if (!child.partial[stream].empty()) EmitLine(child, stream, child.partial[stream]);
      child.partial[stream].clear();
    }
    std::lock_guard<std::mutex> lock(child.mu);
    RankProcessStatus& status = child.status;
    if (child.exit_unknown) {
      status.exit_code = -1;
    } else if (WIFEXITED(child.wait_status)) {
      status.exit_code = WEXITSTATUS(child.wait_status);
    } else if (WIFSIGNALED(child.wait_status)) {
      status.signal = WTERMSIG(child.wait_status);
    }
    if (child.stopped_by_agent) {
      status.state = RankState::kStopped;
    } else if (!child.exit_unknown && WIFEXITED(child.wait_status) && status.exit_code == 0) {
      status.state = RankState::kSucceeded;
    } else {
      status.state = RankState::kFailed;
    }
    status.exited = true;
    child.exited_cv.notify_all();
    return true;
  }

  void Loop() {
    for (;;) {
      std::deque<std::shared_ptr<Request>> requests;
      {
        std::lock_guard<std::mutex> lock(mu_);
        requests.swap(requests_);
      }
      for (auto& request : requests) request->result.set_value(DoSpawn(request->options));

      std::vector<pollfd> fds = {{wake_fd_, POLLIN, 0}};
      std::vector<std::pair<Child*, int>> owners = {{nullptr, -1}};
      absl::Time wake_at = absl::Now() + absl::Milliseconds(100);  // reaping is polled
      for (const auto& child : children_) {
        for (int stream = 0; stream < 2; ++stream) {
          if (child->fds[stream] < 0) continue;
          fds.push_back({child->fds[stream], POLLIN, 0});
          owners.push_back({child.get(), stream});
        }
        if (child->reaped) wake_at = std::min(wake_at, child->drain_deadline);
        std::lock_guard<std::mutex> lock(child->mu);
        if (child->stop_requested && !child->kill_sent) {
          wake_at = std::min(wake_at, child->kill_deadline);
        }
      }
      const int64_t timeout_ms =
          std::max<int64_t>(0, absl::ToInt64Milliseconds(wake_at - absl::Now()) + 1);
      if (poll(fds.data(), fds.size(), static_cast<int>(timeout_ms)) > 0) {
        if (fds[0].revents != 0) {
          uint64_t count;
          ssize_t ignored = read(wake_fd_, &count, sizeof(count));
          (void)ignored;
        }
        for (size_t i = 1; i < fds.size(); ++i) {
          if (fds[i].revents != 0) ReadFrom(*owners[i].first, owners[i].second);
        }
      }
      const absl::Time now = absl::Now();
      children_.erase(
          std::remove_if(children_.begin(), children_.end(),
                         [&](const std::shared_ptr<Child>& child) { return Tick(*child, now); }),
          children_.end());
    }
  }

  const int wake_fd_;
  std::mutex mu_;
  std::deque<std::shared_ptr<Request>> requests_;  // guarded by mu_
  std::vector<std::shared_ptr<Child>> children_;   // supervisor thread only
  std::thread thread_;                             // last: starts once the rest exists
};

}  // namespace

absl::StatusOr<std::unique_ptr<RankProcess>> RankProcess::Start(RankProcessOptions options) {
  auto child = Supervisor::Get().Spawn(std::move(options));
  if (!child.ok()) return child.status();
  return std::unique_ptr<RankProcess>(new RankProcess(*std::move(child)));
}

RankProcess::~RankProcess() {
  {
    std::lock_guard<std::mutex> lock(child_->sink_mu);
    child_->on_line = nullptr;
  }
  std::lock_guard<std::mutex> lock(child_->mu);
  if (!child_->status.exited) {
    child_->stop_requested = true;
    child_->KillLocked();
  }
}

pid_t RankProcess::pid() const { return child_->pid; }

RankProcessStatus RankProcess::Status() const {
  std::lock_guard<std::mutex> lock(child_->mu);
  return child_->status;
}

void RankProcess::Stop(absl::Duration grace) {
  {
    std::lock_guard<std::mutex> lock(child_->mu);
    if (child_->reaped_locked) return;
    const absl::Time deadline = absl::Now() + std::max(grace, absl::ZeroDuration());
    if (!child_->stop_requested) {
      child_->stop_requested = true;
      child_->kill_deadline = deadline;
      // No grace, no SIGTERM: a trainer would start a stop (rank 0 saving) it cannot finish.
      if (grace > absl::ZeroDuration()) kill(-child_->pid, SIGTERM);
    } else {
      child_->kill_deadline = std::min(child_->kill_deadline, deadline);
    }
    if (grace <= absl::ZeroDuration()) child_->KillLocked();
  }
  Supervisor::Get().Wake();
}

bool RankProcess::Wait(absl::Duration timeout) const {
  std::unique_lock<std::mutex> lock(child_->mu);
  const auto exited = [&] { return child_->status.exited; };
  if (timeout == absl::InfiniteDuration()) {
    child_->exited_cv.wait(lock, exited);
    return true;
  }
  return child_->exited_cv.wait_for(lock, absl::ToChronoNanoseconds(timeout), exited);
}

}  // namespace gradhub::agent
