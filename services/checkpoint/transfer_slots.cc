#include "services/checkpoint/transfer_slots.h"

#include "absl/strings/str_cat.h"

namespace gradhub::checkpoint {

TransferSlots::Slot& TransferSlots::Slot::operator=(Slot&& other) noexcept {
  if (this != &other) {
    Release();
    slots_ = std::exchange(other.slots_, nullptr);
    caller_ = std::move(other.caller_);
  }
  return *this;
}

void TransferSlots::Slot::Release() {
  if (slots_ != nullptr) std::exchange(slots_, nullptr)->Release(caller_);
}

absl::StatusOr<TransferSlots::Slot> TransferSlots::Acquire(const std::string& caller) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (total_ >= max_total_) {
      return absl::ResourceExhaustedError(
          absl::StrCat("the checkpoint store serves ", max_total_,
                       " transfers at once (--max-transfers) and all are in use; retry later"));
    }
    int& held = held_[caller];
    if (held >= max_per_caller_) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "this caller already has ", held, " transfers in progress, the most one caller may ",
          "have (--max-transfers-per-caller); retry when one has ended"));
    }
    ++held;
    ++total_;
    if (changed_) changed_(total_);
  }
  return Slot(this, caller);
}

void TransferSlots::Release(const std::string& caller) {
  std::lock_guard<std::mutex> lock(mu_);
  if (--held_[caller] == 0) held_.erase(caller);
  --total_;
  if (changed_) changed_(total_);
}

int TransferSlots::in_progress() const {
  std::lock_guard<std::mutex> lock(mu_);
  return total_;
}

}  // namespace gradhub::checkpoint
