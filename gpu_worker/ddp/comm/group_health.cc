#include "gpu_worker/ddp/comm/group_health.h"

#include "gpu_worker/ddp/comm/work.h"

namespace gradhub::ddp {

void GroupHealth::MarkBroken(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  if (reason_.empty()) reason_ = reason;
  broken_.store(true, std::memory_order_release);
}

std::string GroupHealth::reason() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reason_;
}

std::exception_ptr GroupHealth::UnusableError(const std::string& description,
                                              const std::string& group_name) const {
  return std::make_exception_ptr(CommError(description + ": process group '" + group_name +
                                           "' is unusable after an earlier failure: " + reason()));
}

}  // namespace gradhub::ddp
