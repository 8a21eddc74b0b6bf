// Wakes the agents' WatchAssignments streams (nodes.proto) when desired sets may have changed.
//
// A change is one counter step, not a message: each woken stream reads its node's desired set
// again and sends it only if it differs from what it sent last. So a burst of changes costs
// each stream one read, a stream never misses a change (it compares counters, not signals), and
// nothing here needs to know which nodes a change touched.
//
// Thread-safe: Notify from any thread (the scheduler after a placement or a stop, request
// threads after a cancel); WaitForChange from each stream's handler thread.
#pragma once

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace gradhub::api {

class AssignmentNotifier {
 public:
  // The current change count; read it BEFORE reading a desired set, then wait for a later one.
  uint64_t generation() const {
    std::lock_guard<std::mutex> lock(mu_);
    return generation_;
  }

  void Notify() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++generation_;
    }
    changed_.notify_all();
  }

  // Until the count differs from `seen`, `deadline` passes, Shutdown, or `cancelled()` (polled
  // every 100 ms: a client that went away). Returns the count then.
  uint64_t WaitForChange(uint64_t seen, absl::Time deadline,
                         const std::function<bool()>& cancelled) {
    std::unique_lock<std::mutex> lock(mu_);
    while (generation_ == seen && !shutdown_ && absl::Now() < deadline &&
           !(cancelled && cancelled())) {
      changed_.wait_until(lock, absl::ToChronoTime(std::min(deadline, absl::Now() + kPoll)));
    }
    return generation_;
  }

  // Ends every wait for good (the api is shutting down).
  void Shutdown() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      shutdown_ = true;
    }
    changed_.notify_all();
  }

  bool shutting_down() const {
    std::lock_guard<std::mutex> lock(mu_);
    return shutdown_;
  }

 private:
  static constexpr absl::Duration kPoll = absl::Milliseconds(100);
  mutable std::mutex mu_;
  std::condition_variable changed_;
  uint64_t generation_ = 0;
  bool shutdown_ = false;
};

}  // namespace gradhub::api
