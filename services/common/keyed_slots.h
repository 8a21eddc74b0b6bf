// How many of one kind of long-lived work (a REST server's watch and log streams) run at once,
// in all and per key (a tenant), so that one key cannot take every slot from the others:
//   1. Acquire(key) hands out a Slot when fewer than max_total slots are held and fewer than
//      max_per_key of them by `key`; otherwise RESOURCE_EXHAUSTED, its message naming the limit
//      that was reached and its flag (from Wording), to be retried once one has ended.
//   2. The work holds its Slot for as long as it runs; destroying the Slot frees it.
// Thread-safe. Slots must not outlive their KeyedSlots.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "absl/status/statusor.h"

namespace gradhub {

class KeyedSlots {
 public:
  struct Limits {
    int64_t max_total = 1;    // at least 1
    int64_t max_per_key = 1;  // at least 1
  };
  // What the refusals say: "<max> <what> are open ...; the most ... (<flag>)".
  struct Wording {
    std::string what;          // "watch and log streams"
    std::string key_noun;      // "tenant"
    std::string total_flag;    // "--http-max-streams"
    std::string per_key_flag;  // "--http-max-streams-per-tenant"
  };

  class Slot {
   public:
    Slot() = default;
    Slot(Slot&& other) noexcept
        : slots_(std::exchange(other.slots_, nullptr)), key_(std::move(other.key_)) {}
    Slot& operator=(Slot&& other) noexcept;
    ~Slot() { Release(); }
    Slot(const Slot&) = delete;
    Slot& operator=(const Slot&) = delete;

   private:
    friend class KeyedSlots;
    Slot(KeyedSlots* slots, std::string key) : slots_(slots), key_(std::move(key)) {}
    void Release();

    KeyedSlots* slots_ = nullptr;  // null once moved from or released
    std::string key_;
  };

  KeyedSlots(Limits limits, Wording wording) : limits_(limits), wording_(std::move(wording)) {}

  // Step 1.
  absl::StatusOr<Slot> Acquire(const std::string& key);
  int64_t held() const;
  int64_t held_by(const std::string& key) const;

 private:
  void Release(const std::string& key);

  const Limits limits_;
  const Wording wording_;
  mutable std::mutex mu_;
  int64_t total_ = 0;                    // guarded by mu_
  std::map<std::string, int64_t> held_;  // guarded by mu_: per key, none at 0
};

}  // namespace gradhub
