#include "gpu_worker/ddp/comm/gloo/task_threads.h"

#include <pthread.h>

#include <utility>

namespace gradhub::ddp {

TaskThreads::TaskThreads(std::string name) : name_(std::move(name)) {}

TaskThreads::~TaskThreads() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  for (auto& thread : threads_) thread.join();
}

void TaskThreads::Run(std::function<void()> task) {
  std::lock_guard<std::mutex> lock(mu_);
  tasks_.push_back(std::move(task));
  // A new thread counts as idle from its start, so every queued task has a thread bound to
  // take it, even before the threads woken for earlier tasks got to run.
  if (tasks_.size() > idle_) {
    ++idle_;
    threads_.emplace_back([this] { Loop(); });
  }
  wake_.notify_one();
}

size_t TaskThreads::threads() const {
  std::lock_guard<std::mutex> lock(mu_);
  return threads_.size();
}

void TaskThreads::Loop() {
  pthread_setname_np(pthread_self(), name_.substr(0, 15).c_str());
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    wake_.wait(lock, [this] { return stopping_ || !tasks_.empty(); });
    if (tasks_.empty()) return;  // stopping, and every task taken
    std::function<void()> task = std::move(tasks_.front());
    tasks_.pop_front();
    --idle_;
    lock.unlock();
    task();
    task = nullptr;  // what it captured goes before this thread counts as idle again
    lock.lock();
    ++idle_;
  }
}

}  // namespace gradhub::ddp
