// A fixed set of threads that run the tasks handed to them, first given first started, each on
// whichever thread is free: for work that may block (a database query) and must not block the
// thread that hands it over (StoreService's completion-queue thread).
//
// Thread-safe: Submit may be called from any thread, including from a task. The destructor
// lets the queued tasks run, then joins the threads; no Submit may race with it.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace gradhub::api {

class WorkerPool {
 public:
  explicit WorkerPool(int threads) {
    for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { RunTasks(); });
  }
  ~WorkerPool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    changed_.notify_all();
    for (std::thread& thread : threads_) thread.join();
  }
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  void Submit(std::function<void()> task) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      tasks_.push_back(std::move(task));
    }
    changed_.notify_one();
  }

 private:
  void RunTasks() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      changed_.wait(lock, [this] { return !tasks_.empty() || stopping_; });
      if (tasks_.empty()) return;  // stopping, and nothing is left to run
      std::function<void()> task = std::move(tasks_.front());
      tasks_.pop_front();
      lock.unlock();
      task();
      task = nullptr;  // what it holds goes before the lock is taken again
      lock.lock();
    }
  }

  std::mutex mu_;
  std::condition_variable changed_;
  std::deque<std::function<void()>> tasks_;  // guarded by mu_
  bool stopping_ = false;                    // guarded by mu_
  std::vector<std::thread> threads_;
};

}  // namespace gradhub::api
