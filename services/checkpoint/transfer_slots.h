// How many transfers (upload streams, downloads over gRPC or REST) gradhub-checkpoint serves at
// once, in all and per caller. Each transfer holds buffers (an upload two 4 MiB batches, a
// download its read-ahead), so the limit in all bounds the store's memory; the limit per caller
// keeps one tenant, or one node, from taking every slot from the others' trainers.
//   1. Acquire(caller) hands out a Slot when fewer than `max_total` transfers run and fewer
//      than `max_per_caller` of them are the caller's; otherwise RESOURCE_EXHAUSTED naming the
//      limit that was reached, to be retried later (the trainers' sink backs off and retries).
//   2. A transfer holds its Slot for as long as it runs; destroying the Slot frees it.
//   3. `changed`, when set, hears the number of transfers in progress after every change, in
//      order (under the lock: keep it cheap, as setting the /metrics gauge is).
// Thread-safe. Slots must not outlive their TransferSlots.
#pragma once

#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "absl/status/statusor.h"

namespace gradhub::checkpoint {

class TransferSlots {
 public:
  class Slot {
   public:
    Slot() = default;
    Slot(Slot&& other) noexcept
        : slots_(std::exchange(other.slots_, nullptr)), caller_(std::move(other.caller_)) {}
    Slot& operator=(Slot&& other) noexcept;
    ~Slot() { Release(); }
    Slot(const Slot&) = delete;
    Slot& operator=(const Slot&) = delete;

   private:
    friend class TransferSlots;
    Slot(TransferSlots* slots, std::string caller) : slots_(slots), caller_(std::move(caller)) {}
    void Release();

    TransferSlots* slots_ = nullptr;  // null once moved from or released
    std::string caller_;
  };

  // Both limits at least 1.
  TransferSlots(int max_total, int max_per_caller,
                std::function<void(int in_progress)> changed = nullptr)
      : max_total_(max_total), max_per_caller_(max_per_caller), changed_(std::move(changed)) {}

  // Step 1. `caller` names who asks ("node:gpu-7", "tenant:12", "admin").
  absl::StatusOr<Slot> Acquire(const std::string& caller);
  int in_progress() const;

 private:
  void Release(const std::string& caller);

  const int max_total_;
  const int max_per_caller_;
  const std::function<void(int)> changed_;
  mutable std::mutex mu_;
  int total_ = 0;                    // guarded by mu_
  std::map<std::string, int> held_;  // guarded by mu_: slots held per caller, none at 0
};

}  // namespace gradhub::checkpoint
