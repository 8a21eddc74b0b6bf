#include "gpu_worker/ddp/comm/work.h"

namespace gradhub::ddp {

void Work::Wait(std::chrono::milliseconds timeout) {
  if (timeout == std::chrono::milliseconds::zero()) timeout = default_timeout_;
  if (finish_here_ && timeout >= default_timeout_) finish_here_();
  std::unique_lock<std::mutex> lock(mu_);
  if (!done_.wait_for(lock, timeout, [this] { return completed_; })) {
    throw CommError(description_ + ": not completed after " + std::to_string(timeout.count()) +
                    " ms");
  }
  if (error_) std::rethrow_exception(error_);
}

bool Work::IsCompleted() const {
  std::lock_guard<std::mutex> lock(mu_);
  return completed_;
}

std::exception_ptr Work::error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

Work::Clock::time_point Work::start_time() const {
  std::lock_guard<std::mutex> lock(mu_);
  return start_time_;
}

Work::Clock::time_point Work::end_time() const {
  std::lock_guard<std::mutex> lock(mu_);
  return end_time_;
}

void Work::OnCompletion(std::function<void()> callback) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!completed_) {
      callbacks_.push_back(std::move(callback));
      return;
    }
  }
  callback();
}

void Work::MarkStarted() {
  std::lock_guard<std::mutex> lock(mu_);
  start_time_ = Clock::now();
}

// Callbacks run before waiters are woken, so a caller whose Wait() returned sees their
// effects. While they run, end_time_ is set but completed_ is not: a second Complete() is
// ignored, and an OnCompletion() arriving meanwhile queues its callback, which the loop runs.
void Work::Complete(std::exception_ptr error) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (completed_ || end_time_ != Clock::time_point{}) return;
    error_ = error;
    end_time_ = Clock::now();
    if (start_time_ == Clock::time_point{}) start_time_ = end_time_;
  }
  for (;;) {
    std::vector<std::function<void()>> callbacks;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (callbacks_.empty()) {
        completed_ = true;
        break;
      }
      callbacks.swap(callbacks_);
    }
    for (auto& callback : callbacks) callback();
  }
  done_.notify_all();
}

}  // namespace gradhub::ddp
