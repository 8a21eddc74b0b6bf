// Runs a function every `interval` on a thread of its own, until Stop(): gradhub-checkpoint's
// cleanup and scrub, gradhub-metrics' sweep of job states.
#pragma once

#include <functional>
#include <thread>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace gradhub {

// Thread-compatible: Start and Stop from one thread; stopping() from any.
class PeriodicTask {
 public:
  enum class FirstRun {
    kAfterInterval,  // one interval after Start (a cleanup that just ran before serving)
    kAtStart,        // at once on Start, then every interval (a check others wait for)
  };

  // `run` may poll stopping() to end a long run early. A zero or negative interval never
  // repeats: such a task runs only its kAtStart run, if it has one.
  PeriodicTask(absl::Duration interval, std::function<void()> run,
               FirstRun first_run = FirstRun::kAfterInterval)
      : interval_(interval), run_(std::move(run)), first_run_(first_run) {}
  ~PeriodicTask() { Stop(); }
  PeriodicTask(const PeriodicTask&) = delete;
  PeriodicTask& operator=(const PeriodicTask&) = delete;

  void Start() {
    if (thread_.joinable()) return;
    const bool repeats = interval_ > absl::ZeroDuration();
    if (!repeats && first_run_ == FirstRun::kAfterInterval) return;
    thread_ = std::thread([this, repeats] {
      if (first_run_ == FirstRun::kAtStart && !stopping()) run_();
      if (!repeats) return;
      while (!stop_.WaitForNotificationWithTimeout(interval_)) run_();
    });
  }

  // True once Stop() was called; any thread.
  bool stopping() const { return stop_.HasBeenNotified(); }

  // Waits for a run in progress to end. Idempotent.
  void Stop() {
    if (!thread_.joinable()) return;
    if (!stop_.HasBeenNotified()) stop_.Notify();
    thread_.join();
  }

 private:
  const absl::Duration interval_;
  const std::function<void()> run_;
  const FirstRun first_run_;
  absl::Notification stop_;
  std::thread thread_;
};

}  // namespace gradhub
