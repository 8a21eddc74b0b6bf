// Runs a function every `interval` on a thread of its own, until Stop() (the cleanup and the
// scrub of gradhub-checkpoint). The first run is one interval after Start.
#pragma once

#include <functional>
#include <string>
#include <thread>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace gradhub::checkpoint {

// Thread-compatible: Start and Stop from one thread. A zero or negative interval never runs.
class PeriodicTask {
 public:
  // `run` may poll stopping() to end a long run early.
  PeriodicTask(absl::Duration interval, std::function<void()> run)
      : interval_(interval), run_(std::move(run)) {}
  ~PeriodicTask() { Stop(); }
  PeriodicTask(const PeriodicTask&) = delete;
  PeriodicTask& operator=(const PeriodicTask&) = delete;

  void Start() {
    if (interval_ <= absl::ZeroDuration() || thread_.joinable()) return;
    thread_ = std::thread([this] {
      while (!stop_.WaitForNotificationWithTimeout(interval_)) run_();
    });
  }

  // True once Stop() was called; any thread.
  bool stopping() const { return stop_.HasBeenNotified(); }

  // Waits for a run in progress to end. Idempotent.
  void Stop() {
    if (!thread_.joinable()) return;
    stop_.Notify();
    thread_.join();
  }

 private:
  const absl::Duration interval_;
  const std::function<void()> run_;
  absl::Notification stop_;
  std::thread thread_;
};

}  // namespace gradhub::checkpoint
