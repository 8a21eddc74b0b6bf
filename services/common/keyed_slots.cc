#include "services/common/keyed_slots.h"

#include "absl/strings/str_cat.h"

namespace gradhub {

KeyedSlots::Slot& KeyedSlots::Slot::operator=(Slot&& other) noexcept {
  if (this != &other) {
    Release();
    slots_ = std::exchange(other.slots_, nullptr);
    key_ = std::move(other.key_);
  }
  return *this;
}

void KeyedSlots::Slot::Release() {
  if (slots_ != nullptr) std::exchange(slots_, nullptr)->Release(key_);
}

absl::StatusOr<KeyedSlots::Slot> KeyedSlots::Acquire(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  if (total_ >= limits_.max_total) {
    return absl::ResourceExhaustedError(
        absl::StrCat(total_, " ", wording_.what, " are open, the most this server serves at once (",
                     wording_.total_flag, "); retry when one has ended"));
  }
  auto [it, inserted] = held_.try_emplace(key, 0);
  if (it->second >= limits_.max_per_key) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "this ", wording_.key_noun, " has ", it->second, " ", wording_.what, " open, the most one ",
        wording_.key_noun, " may have (", wording_.per_key_flag, "); close one or retry later"));
  }
  ++it->second;
  ++total_;
  return Slot(this, key);
}

void KeyedSlots::Release(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  if (--held_[key] == 0) held_.erase(key);
  --total_;
}

int64_t KeyedSlots::held() const {
  std::lock_guard<std::mutex> lock(mu_);
  return total_;
}

int64_t KeyedSlots::held_by(const std::string& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = held_.find(key);
  return it == held_.end() ? 0 : it->second;
}

}  // namespace gradhub
