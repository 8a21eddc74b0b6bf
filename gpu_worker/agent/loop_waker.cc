#include "gpu_worker/agent/loop_waker.h"

namespace gradhub::agent {

void LoopWaker::Shutdown() {
  std::lock_guard<std::mutex> lock(mu_);
  shutdown_ = true;
  cv_.notify_all();
}

void LoopWaker::Notify() {
  std::lock_guard<std::mutex> lock(mu_);
  news_ = true;
  cv_.notify_all();
}

void LoopWaker::SleepUntil(absl::Time deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_until(lock, absl::ToChronoTime(deadline),
                 [&] { return shutdown_.load() || news_.load(); });
}

}  // namespace gradhub::agent
