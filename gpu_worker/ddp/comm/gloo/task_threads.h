#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace gradhub::ddp {

// Runs every task at once on a thread of its own: an idle one when there is one, else a new
// one. For tasks that block until a peer acts (a point-to-point transfer waits for its peer's
// matching call): with a fixed number of threads, a receive queued behind a send that waits
// for that receive's own peer could wait forever. Threads stay until destruction, so there
// are as many as tasks ever ran at once.
//
// Thread-safe. Tasks must not throw. Destruction waits for every task, queued ones included,
// to end, then joins the threads.
class TaskThreads {
 public:
  // `name` names the threads (pthread names are cut to 15 characters).
  explicit TaskThreads(std::string name);
  ~TaskThreads();
  TaskThreads(const TaskThreads&) = delete;
  TaskThreads& operator=(const TaskThreads&) = delete;

  void Run(std::function<void()> task);

  // Threads started so far (for tests).
  size_t threads() const;

 private:
  void Loop();

  const std::string name_;
  mutable std::mutex mu_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> tasks_;
  // Threads that are waiting for a task or about to take one: each queued task has one.
  size_t idle_ = 0;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace gradhub::ddp
