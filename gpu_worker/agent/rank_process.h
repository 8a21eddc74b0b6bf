// RankProcess: one trainer process (one rank) started and watched by the node agent.
//
// Process model. Every RankProcess is forked by one process-wide supervisor thread that is
// started on first use and lives until the agent process exits. It matters which thread forks:
// PR_SET_PDEATHSIG fires when the *thread* that forked the child exits, not when the process
// does, so a child forked from a short-lived thread (or a gRPC callback thread) would be
// SIGKILLed as soon as that thread ended. With one permanent forking thread, the signal fires
// exactly when the agent dies, however it dies.
//
// The same thread owns everything else about the children, so nothing here ever blocks the
// caller (the heartbeat loop) on a child:
//   - it polls the stdout/stderr pipes of every child, splits them into lines and hands each
//     line to the RankProcess's LineCallback (on the supervisor thread, in seq order);
//   - it is the only caller of waitpid for these children, always for one specific pid, so it
//     neither steals other children of the process (tests' Subprocess) nor leaves zombies;
//   - it sends the SIGKILL that follows a Stop() once the grace period has passed.
//
// Launch protocol. Before fork, the agent has created the rank's memory cgroup with its limit
// and opened its cgroup.procs (memory_limit.h), and built argv and envp. Then, in the child,
// between fork and exec (only async-signal-safe calls and raw syscalls):
//   1. setpgid(0, 0): the rank and anything it spawns are one process group (Stop and leftover
//      cleanup signal the group).
//   2. Join the memory cgroup: write our pid to the cgroup.procs opened before fork. First,
//      before the rank can allocate anything, and while still root (the file is root's).
//      Failure: exit 127, "cannot join memory cgroup"; a rank never runs unlimited by mistake.
//   3. Signal mask and ignored signals reset (the agent blocks SIGTERM for its sigwait thread,
//      and exec would pass that on); stdin /dev/null, stdout/stderr the pipes; every other fd
//      close-on-exec.
//   4. RLIMIT_DATA when the node limits memory by rlimit (no cgroup). RLIMIT_NICE 20: a rank
//      may put a thread it lowered (the trainer's checkpoint saves run at SCHED_IDLE) back to
//      normal priority, nice 0, and never above it. Where the agent may not raise it (neither
//      CAP_SYS_RESOURCE nor a hard limit of 20 of its own), the rank keeps the agent's, and
//      the trainer then saves at normal priority.
//   5. Drop privileges, when the identity says so: setgroups (only the identity's supplementary
//      groups, usually none),
//      setresgid, setresuid, as raw syscalls (glibc's wrappers would try to signal the
//      agent's other threads, which do not exist in the child). Then checked: the real,
//      effective and saved ids are the user's and setresuid(0) fails; PR_SET_NO_NEW_PRIVS so
//      no setuid binary can raise them again. Failure: exit 127 with the reason; never exec
//      with root's credentials.
//   6. PR_SET_PDEATHSIG(SIGKILL), after step 5 because the kernel clears it on any credential
//      change; then getppid() is compared with the agent's pid, because an agent that died
//      before prctl would never send the signal. Failure: exit 127.
//   7. chdir to the working directory, as the rank's user (so it must be theirs to enter).
//   8. execve with the agent's environment plus the given variables. Failure: exit 127.
// After the rank exits, its cgroup is read (an oom_kill means the kernel stopped it at its
// limit: RankProcessStatus.out_of_memory) and removed.
//
// When the leader exits, the rest of its process group is SIGKILLed (while the leader is still
// an unreaped zombie, so the group id cannot have been reused), the pipes are drained (for at
// most kDrainTimeout, in case something outside the group holds them), and only then does the
// process count as exited. So once Status().exited is true, every line of its output has been
// passed to the LineCallback.
#pragma once

#include <sys/resource.h>
#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gpu_worker/agent/memory_limit.h"
#include "gpu_worker/agent/rank_user.h"

namespace gradhub::agent {

// Launch step 4: the lowest nice value a rank may give its threads is 20 - this, i.e. 0.
inline constexpr rlim_t kRankNiceLimit = 20;
// Longest line passed on; longer ones are split (LogEntry.text: "Lines longer than 64 KiB are
// split").
inline constexpr size_t kMaxLineBytes = 64 * 1024;
// How long the pipes are drained after the process group is gone.
inline constexpr absl::Duration kDrainTimeout = absl::Seconds(2);
// Longest RankStatus.message (the last stderr line of a failed rank).
inline constexpr size_t kMaxMessageBytes = 1024;

enum class OutputStream { kStdout, kStderr };

// One line of a rank's output. `seq` counts lines across both streams, starting at 1 (the
// LogEntry.seq the server deduplicates on). `text` has no trailing newline and is valid UTF-8
// (invalid bytes become U+FFFD, since proto3 strings must be UTF-8); at most kMaxLineBytes.
struct OutputLine {
  OutputStream stream = OutputStream::kStdout;
  int64_t seq = 0;
  absl::Time time;  // when the agent read it
  std::string text;
};
using LineCallback = std::function<void(const OutputLine&)>;

// Which of the agent's own environment variables a rank inherits: only what finds programs and
// libraries, sets the locale, and tunes threads and collectives (PATH, LD_LIBRARY_PATH, LANG,
// LANGUAGE, TZ, TMPDIR, LC_*, OMP_*, MKL_*, OPENBLAS_*, CUDA_*, NCCL_*, GLOO_*, TORCH_*, and
// the trainer's tuning: GRADHUB_THREADS, GRADHUB_COLLECTIVE_TIMEOUT, GRADHUB_PREEMPT_GRACE;
// the collective timeout is the node's default, which a job's own overrides, rank_launch.h).
// Never the rest: the agent's environment may hold its token, TLS key paths, cloud
// credentials, and a rank runs a tenant's code.
bool RankInheritsVariable(std::string_view name);

struct RankProcessOptions {
  // The credentials the rank runs with (step 5); switch_user false = the agent's own.
  RankIdentity identity;
  // The rank's memory cgroup, joined in step 2 and owned by the RankProcess from Start on (it
  // is read and removed once the rank has exited; shared only so options stay copyable).
  // Null = none.
  std::shared_ptr<MemoryCgroup> memory_cgroup;
  // RLIMIT_DATA for the rank (step 4); 0 = the agent's.
  int64_t rlimit_data_bytes = 0;
  // argv[0] is the program's path (no PATH lookup).
  std::vector<std::string> argv;
  // Added to (and overriding) what the rank inherits of the agent's environment
  // (RankInheritsVariable).
  std::map<std::string, std::string> env;
  // The child's working directory; must exist. Empty = the agent's.
  std::string working_dir;
  // If set, "pid starttime boot_id" is written here after the fork and removed once the
  // process is reaped, so that a restarted agent can kill what it left (see leftovers.h).
  std::string pid_file;
  // Called on the supervisor thread for every line, in seq order. Must not block for long and
  // must not call back into this RankProcess. May be empty.
  LineCallback on_line;
  // How many of the last stderr lines RankProcessStatus::last_stderr_line keeps (a script's
  // traceback says more than its last line).
  int message_lines = 1;
};

// Matches RankStatus.State.
enum class RankState { kStarting, kRunning, kSucceeded, kFailed, kStopped };
const char* RankStateName(RankState state);

struct RankProcessStatus {
  pid_t pid = 0;
  // kStarting until a progress line with a step is seen, then kRunning; once exited:
  // kStopped if Stop() was called before it exited, else kSucceeded (exit 0) or kFailed.
  RankState state = RankState::kStarting;
  bool exited = false;
  int exit_code = 0;  // set once exited by a normal exit
  int signal = 0;     // set once exited by a signal
  // From the trainer's progress records on stdout (any event, progress_record.h): the highest
  // step seen and when its line was read.
  int64_t last_step = 0;
  absl::Time last_step_time = absl::InfinitePast();
  // The last non-empty stderr line (the last RankProcessOptions::message_lines of them, one a
  // line), at most kMaxMessageBytes.
  std::string last_stderr_line;
  // The limit put on the rank (its cgroup's, or RLIMIT_DATA); 0 = none.
  int64_t memory_limit_bytes = 0;
  // Once exited, with a memory cgroup: the kernel's OOM killer killed a process of the rank at
  // the limit, and the most memory the rank was charged (0 if the kernel does not say).
  bool out_of_memory = false;
  int64_t memory_peak_bytes = 0;
};

// Thread-safe: every method may be called from any thread.
class RankProcess {
 public:
  // Forks and execs (on the supervisor thread; returns once the child exists). An exec that
  // fails in the child is an exit with code 127 and a line on stderr saying why.
  static absl::StatusOr<std::unique_ptr<RankProcess>> Start(RankProcessOptions options);

  // SIGKILLs the process group if it is still running; the supervisor still reaps it.
  // No LineCallback runs after the destructor has returned.
  ~RankProcess();
  RankProcess(const RankProcess&) = delete;
  RankProcess& operator=(const RankProcess&) = delete;

  pid_t pid() const;
  RankProcessStatus Status() const;

  // Asks the process to stop: SIGTERM to its process group now, SIGKILL to the group after
  // `grace` unless it has exited; with no grace (zero or less), SIGKILL alone, now. Returns at
  // once. The exit then counts as kStopped. A second call can only shorten the grace (a zero
  // one SIGKILLs now). No effect once it has exited.
  void Stop(absl::Duration grace);

  // Waits until exited (see the top comment); false after `timeout`.
  bool Wait(absl::Duration timeout) const;

  struct Child;  // shared with the supervisor thread

 private:
  explicit RankProcess(std::shared_ptr<Child> child) : child_(std::move(child)) {}
  std::shared_ptr<Child> child_;
};

// Splits raw bytes of one line (no newline) into valid-UTF-8 pieces of at most `max_bytes`,
// never cutting a character. Exposed for tests.
std::vector<std::string> SanitizeAndSplitLine(const std::string& raw,
                                              size_t max_bytes = kMaxLineBytes);

}  // namespace gradhub::agent
