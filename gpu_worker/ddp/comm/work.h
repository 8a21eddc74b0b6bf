#pragma once

#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

namespace gradhub::ddp {

// A collective failed: a peer died or never arrived, the transport broke, or it ran out of
// time. The message names the operation, the group and the rank, e.g.
// "allreduce #17 (float32, 4096 elements) in group 'job-1/attempt-2' rank 1/2: timed out
// after 5000 ms".
class CommError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Handle of one asynchronous collective (c10d's Work). Backends complete it exactly once,
// with success or an error. Thread-safe.
class Work {
 public:
  using Clock = std::chrono::steady_clock;

  // `description` names the collective, group and rank for error messages;
  // `default_timeout` is what Wait() waits by default (the group's timeout).
  Work(std::string description, std::chrono::milliseconds default_timeout)
      : description_(std::move(description)), default_timeout_(default_timeout) {}
  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;

  // Blocks until the collective completed, then rethrows its error if it failed. A Wait that
  // runs out of `timeout` first throws CommError; the collective itself still ends within
  // the process group's own timeout. Zero means "the process group's timeout".
  void Wait(std::chrono::milliseconds timeout = std::chrono::milliseconds::zero());

  bool IsCompleted() const;
  // The error it failed with; null while running or after success.
  std::exception_ptr error() const;

  // When the backend started and finished executing it (for telemetry and overlap checks).
  Clock::time_point start_time() const;
  Clock::time_point end_time() const;

  // Runs `callback` once the work completes (at once if it already has), on the thread that
  // completes it. Must be cheap and must not throw.
  void OnCompletion(std::function<void()> callback);

  // Backend side.
  // Before the Work is handed out: lets a thread that waits for it run the backend's
  // remaining part itself instead of waiting for a backend thread to run it and wake it (two
  // thread hand-offs on the critical path, tens of microseconds each on a busy host). Wait()
  // calls `finish_here` first when it waits at least the group's timeout (a shorter wait must
  // be free to give up first). `finish_here` returns at once when a backend thread has taken
  // that part already, and otherwise completes the Work before it returns.
  void LetWaiterFinish(std::function<void()> finish_here) { finish_here_ = std::move(finish_here); }
  void MarkStarted();
  void Complete(std::exception_ptr error = nullptr);

  const std::string& description() const { return description_; }

 private:
  const std::string description_;
  const std::chrono::milliseconds default_timeout_;
  mutable std::mutex mu_;
  std::condition_variable done_;
  bool completed_ = false;
  std::exception_ptr error_;
  Clock::time_point start_time_{}, end_time_{};
  std::vector<std::function<void()>> callbacks_;
  std::function<void()> finish_here_;  // set before the Work is handed out, then only read
};

}  // namespace gradhub::ddp
