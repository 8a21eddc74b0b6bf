// What wakes the agent's protocol loop (agent.h) from its sleep between heartbeats: Shutdown(),
// for good, and news from the AssignmentWatch, for one heartbeat now.
//   1. Notify() (on the watch's thread) sets the news and wakes a sleeper. News set while the
//      loop is awake makes its next sleep return at once: no wake-up is lost.
//   2. The loop clears the news (ClearNews) right before it heartbeats: that heartbeat's answer
//      covers whatever the watch saw until then.
//
// Thread-safe.
#pragma once

#include <atomic>
#include <condition_variable>
#include <mutex>

#include "absl/time/time.h"

namespace gradhub::agent {

class LoopWaker {
 public:
  void Shutdown();
  void Notify();
  void ClearNews() { news_ = false; }
  bool shutdown() const { return shutdown_.load(); }
  bool news() const { return news_.load(); }
  // Until `deadline`, Shutdown() or news.
  void SleepUntil(absl::Time deadline);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  // Atomic: read without mu_ by the loop; set under mu_, so a sleeper cannot miss the change.
  std::atomic<bool> shutdown_{false};
  std::atomic<bool> news_{false};
};

}  // namespace gradhub::agent
