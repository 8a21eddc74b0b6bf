// The process mechanics of `gradhub cluster`: starting services that outlive the CLI, running
// a helper to completion, and telling later whether a recorded pid is still the process we
// started (pids are reused; `down` must never signal a stranger).
#pragma once

#include <sys/types.h>

#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace gradhub::cli {

// The variable every process of a local cluster carries, set to its state directory: how
// `down` and `status` recognize their own processes in /proc/PID/environ.
inline constexpr char kClusterMarker[] = "GRADHUB_CLUSTER_STATE_DIR";

// `env` is added to (and overrides) our own environment.
struct ProcessSpec {
  std::vector<std::string> argv;  // argv[0] is an absolute path
  std::map<std::string, std::string> env;
};

// Starts `spec` detached: in a session of its own (setsid), so it outlives the CLI and a ^C
// at the terminal does not reach it; stdin from /dev/null, stdout and stderr to `log`
// (a previous log is kept as `log`.1); no other descriptor of ours.
absl::StatusOr<pid_t> SpawnDetached(const ProcessSpec& spec, const std::string& log);

// Runs `spec` to completion with stdout to `out_file` and stderr to `err_file`; the exit code,
// or an error if it could not run.
absl::StatusOr<int> RunToCompletion(const ProcessSpec& spec, const std::string& out_file,
                                    const std::string& err_file);

// Whether `pid` is a live process (not a zombie).
bool IsAlive(pid_t pid);

// Whether `pid` is alive and is a process of the cluster in `state_dir`: started from
// `binary` (its argv[0]) with kClusterMarker=`state_dir` in its environment.
bool IsClusterProcess(pid_t pid, const std::string& binary, const std::string& state_dir);

// The NUL-separated arguments of /proc/PID/cmdline; empty when the process is gone.
std::vector<std::string> CommandLine(pid_t pid);

// Waits until `log` contains every marker in `markers` (e.g. "serving gRPC on port ") and
// returns, for each, the text after it up to the end of its line. An error, with the end of
// the log, when `pid` exits first or `timeout` passes.
absl::StatusOr<std::map<std::string, std::string>> WaitForLogLines(
    pid_t pid, const std::string& log, const std::vector<std::string>& markers,
    absl::Duration timeout);

// The last `lines` lines of a file ("" when it cannot be read).
std::string TailOfFile(const std::string& path, int lines);

// A loopback port that was free a moment ago, for a program that cannot pick its own (0).
absl::StatusOr<int> FreeLoopbackPort();

// `bytes` random bytes as hex, from /dev/urandom.
std::string RandomHex(int bytes);

}  // namespace gradhub::cli
