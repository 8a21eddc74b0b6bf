// A thread for every task at once, for an HTTP server's connections: each holds its thread for
// as long as it lives, so that a slow client, an upload or a stream never makes another
// connection wait for a thread (how many run at once is bounded before Run, by the admission
// layer of http_connection_limits.h). Threads are reused: up to `idle_threads` of those whose
// task ended wait for the next one, the others end, so that a burst leaves no crowd of threads
// and the common case makes none.
//
// SIGPIPE is blocked on these threads: a write to a peer that went away fails (EPIPE) instead of
// ending the process.
//
// Thread-safe: Run may be called from any thread. Drain (and the destructor) waits for every
// task to end; tasks run by then must end on their own (the server ends its connections).
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>

namespace gradhub {

class ConnectionThreads {
 public:
  explicit ConnectionThreads(int idle_threads) : max_idle_(idle_threads) {}
  ~ConnectionThreads() { Drain(); }
  ConnectionThreads(const ConnectionThreads&) = delete;
  ConnectionThreads& operator=(const ConnectionThreads&) = delete;

  // Starts `task` on an idle thread, or on a new one when none is idle.
  void Run(std::function<void()> task);
  // Waits until every task has ended and every thread is gone.
  void Drain();
  // Threads alive (running a task or idle).
  int threads() const;

 private:
  void Work();

  const int max_idle_;
  mutable std::mutex mu_;
  std::condition_variable work_;             // a task was queued, or Drain began
  std::condition_variable gone_;             // a thread ended
  std::deque<std::function<void()>> tasks_;  // guarded by mu_
  int threads_ = 0;                          // guarded by mu_
  int idle_ = 0;                             // guarded by mu_: waiting for a task
  bool draining_ = false;                    // guarded by mu_
};

}  // namespace gradhub
