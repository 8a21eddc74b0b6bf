#pragma once

#include <atomic>
#include <exception>
#include <mutex>
#include <string>

namespace gradhub::ddp {

// Whether a process group still works. Both backends follow one rule: the first collective
// that fails (peer gone, transport error, timeout) breaks the group for good, and every
// collective queued or issued after it fails at once with an error that names that first
// failure; the job is expected to restart. Thread-safe.
class GroupHealth {
 public:
  bool broken() const { return broken_.load(std::memory_order_acquire); }

  // Records `reason` unless a failure was recorded before: the first one is the cause.
  void MarkBroken(const std::string& reason);

  // The first failure's reason; empty while healthy.
  std::string reason() const;

  // CommError "<description>: process group '<group_name>' is unusable after an earlier
  // failure: <reason>", for a collective that comes after the failure.
  std::exception_ptr UnusableError(const std::string& description,
                                   const std::string& group_name) const;

 private:
  mutable std::mutex mu_;
  std::atomic<bool> broken_{false};
  std::string reason_;
};

}  // namespace gradhub::ddp
