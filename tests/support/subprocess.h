// Real processes for end-to-end tests: the trainer, the api, agents.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <map>
#include <string>
#include <vector>

namespace gradhub::testing {

// A child process whose stdout and stderr go to files. Killed (SIGKILL) if still running
// when destroyed, so a failing test leaves nothing behind.
class Subprocess {
 public:
  // Starts argv[0] (a path) with the current environment plus `env`.
  Subprocess(std::vector<std::string> argv, std::map<std::string, std::string> env = {});
  ~Subprocess();
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;

  pid_t pid() const { return pid_; }
  // Waits for the exit; returns the exit code, or 128 + signal. -1 after `timeout` (the
  // process keeps running).
  int Wait(std::chrono::milliseconds timeout = std::chrono::minutes(5));
  void Kill(int signal);
  bool running();

  std::string out() const;  // everything written to stdout so far
  std::string err() const;

 private:
  pid_t pid_ = -1;
  bool reaped_ = false;
  int status_ = 0;
  std::string dir_;
};

// Starts, waits (failing with the output after `timeout`) and returns the exit code.
struct RunResult {
  int exit_code = -1;
  std::string out, err;
};
RunResult Run(std::vector<std::string> argv, std::map<std::string, std::string> env = {},
              std::chrono::milliseconds timeout = std::chrono::minutes(5));

// A fresh temporary directory, removed when the object is destroyed.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// $GRADHUB_BUILD_DIR/bin/<name> (set by gradhub_add_test).
std::string BinaryPath(const std::string& name);

}  // namespace gradhub::testing
