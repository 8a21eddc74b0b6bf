#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>

namespace gradhub {

// Runs tasks one after another, in the order they were given, on a thread of its own, so that
// a producer (an upload stream receiving chunks) hands work off and goes on producing.
//   1. Submit(bytes, task) queues the task with the bytes it holds. It blocks while the queued
//      tasks hold more than `max_queued_bytes`, so memory stays bounded when the thread is
//      slower than the producer; one task is always admitted, however large.
//   2. The thread (started by the first Submit) runs the tasks in order.
//   3. Drain() waits until every task submitted before it has run.
// Submit and Drain may come from several threads: tasks run in the order Submit admitted
// them, and Drain waits for everyone's. The destructor runs what is queued, then joins the
// thread.
class OrderedWorker {
 public:
  explicit OrderedWorker(size_t max_queued_bytes) : max_queued_bytes_(max_queued_bytes) {}
  ~OrderedWorker() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    changed_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  OrderedWorker(const OrderedWorker&) = delete;
  OrderedWorker& operator=(const OrderedWorker&) = delete;

  void Submit(size_t bytes, std::function<void()> task) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!thread_.joinable()) thread_ = std::thread([this] { RunQueued(); });
    changed_.wait(lock, [&] { return pending_ == 0 || queued_bytes_ < max_queued_bytes_; });
    queued_bytes_ += bytes;
    ++pending_;
    queue_.push_back({bytes, std::move(task)});
    changed_.notify_all();
  }

  void Drain() {
    std::unique_lock<std::mutex> lock(mu_);
    changed_.wait(lock, [&] { return pending_ == 0; });
  }

 private:
  struct Task {
    size_t bytes;
    std::function<void()> run;
  };

  void RunQueued() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      changed_.wait(lock, [&] { return !queue_.empty() || stopping_; });
      if (queue_.empty()) return;  // stopping, and everything queued has run
      Task task = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      task.run();
      task.run = nullptr;  // whatever it holds goes before the producer is told
      lock.lock();
      queued_bytes_ -= task.bytes;
      --pending_;
      changed_.notify_all();
    }
  }

  const size_t max_queued_bytes_;
  std::mutex mu_;
  std::condition_variable changed_;
  std::deque<Task> queue_;   // guarded by mu_
  size_t queued_bytes_ = 0;  // guarded by mu_: held by queued tasks and the one running
  size_t pending_ = 0;       // guarded by mu_: queued tasks and the one running
  bool stopping_ = false;    // guarded by mu_
  std::thread thread_;
};

}  // namespace gradhub
