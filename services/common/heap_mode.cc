#include "services/common/heap_mode.h"

#include <malloc.h>

namespace gradhub {

namespace {
constexpr int kLargestHeapBlockBytes = 32 << 20;
constexpr int kFreeTopKeptBytes = 64 << 20;
}  // namespace

void KeepFreedHeapForTheNextMessage() {
  // mallopt returns 0 on a value it refuses; these are within its bounds on every glibc, and a
  // refusal would only leave the defaults, so there is nothing to report.
  mallopt(M_MMAP_THRESHOLD, kLargestHeapBlockBytes);
  mallopt(M_TRIM_THRESHOLD, kFreeTopKeptBytes);
}

}  // namespace gradhub
