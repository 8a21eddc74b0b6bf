// How Store backends without server-side notification wait for keys: they look, and if the
// key is not there yet, sleep and look again. FileStore polls its directory, TcpStore its
// server (see tcp_store.h for why it does not use c10d's blocking wait).
#pragma once

#include <algorithm>
#include <chrono>
#include <thread>

namespace gradhub::ddp {

// Sleeps between polls: 1 ms, doubling to at most 20 ms, so a key set soon is seen soon and a
// long wait costs little CPU; never sleeps past the deadline. Not thread-safe: one per wait.
//
//   Poller poller(timeout);
//   while (!Look()) {
//     if (!poller.Sleep()) throw StoreTimeoutError(...);
//   }
class Poller {
 public:
  static constexpr std::chrono::milliseconds kFirstPoll{1};
  static constexpr std::chrono::milliseconds kMaxPoll{20};

  explicit Poller(std::chrono::milliseconds timeout) {
    using std::chrono::steady_clock;
    auto now = steady_clock::now();
    // Saturate rather than overflow for "wait forever" timeouts like milliseconds::max().
    auto room = std::chrono::duration_cast<std::chrono::milliseconds>(
        steady_clock::time_point::max() - now);
    deadline_ = timeout >= room ? steady_clock::time_point::max() : now + timeout;
  }

  // False once the deadline has passed: the caller's last look was its final one.
  bool Sleep() {
    using std::chrono::steady_clock;
    auto now = steady_clock::now();
    if (now >= deadline_) return false;
    std::this_thread::sleep_for(std::min<steady_clock::duration>(delay_, deadline_ - now));
    delay_ = std::min(delay_ * 2, kMaxPoll);
    return true;
  }

 private:
  std::chrono::steady_clock::time_point deadline_;
  std::chrono::milliseconds delay_ = kFirstPoll;
};

}  // namespace gradhub::ddp
