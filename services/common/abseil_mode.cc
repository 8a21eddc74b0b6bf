#include "services/common/abseil_mode.h"

#include "absl/synchronization/mutex.h"

namespace gradhub {

void TurnOffMutexDeadlockDetection() {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
}

}  // namespace gradhub
