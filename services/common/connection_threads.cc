#include "services/common/connection_threads.h"

#include <pthread.h>
#include <signal.h>

#include <thread>

namespace gradhub {

void ConnectionThreads::Run(std::function<void()> task) {
  std::lock_guard<std::mutex> lock(mu_);
  tasks_.push_back(std::move(task));
  if (static_cast<int>(tasks_.size()) <= idle_) {
    work_.notify_one();
    return;
  }
  ++threads_;
  // Detached: the thread touches nothing of this object after its last unlock, and Drain
  // waits for that (gone_ is notified under the lock).
  std::thread([this] { Work(); }).detach();
}

void ConnectionThreads::Work() {
  sigset_t pipe;
  sigemptyset(&pipe);
  sigaddset(&pipe, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe, nullptr);
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    if (tasks_.empty()) {
      if (draining_ || idle_ >= max_idle_) break;
      ++idle_;
      work_.wait(lock, [this] { return !tasks_.empty() || draining_; });
      --idle_;
      continue;
    }
    std::function<void()> task = std::move(tasks_.front());
    tasks_.pop_front();
    lock.unlock();
    task();
    task = nullptr;  // what it holds goes before the lock is taken again
    lock.lock();
  }
  --threads_;
  gone_.notify_all();
}

void ConnectionThreads::Drain() {
  std::unique_lock<std::mutex> lock(mu_);
  draining_ = true;
  work_.notify_all();
  gone_.wait(lock, [this] { return threads_ == 0; });
  draining_ = false;
}

int ConnectionThreads::threads() const {
  std::lock_guard<std::mutex> lock(mu_);
  return threads_;
}

}  // namespace gradhub
