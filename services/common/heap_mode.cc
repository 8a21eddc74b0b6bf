#include "services/common/heap_mode.h"

#include <malloc.h>

namespace gradhub {

void KeepFreedHeapForTheNextMessage(HeapKeep keep) {
  // mallopt returns 0 on a value it refuses; these are within its bounds on every glibc, and a
  // refusal would only leave the defaults, so there is nothing to report.
  mallopt(M_MMAP_THRESHOLD, keep.largest_heap_block_bytes);
  mallopt(M_TRIM_THRESHOLD, keep.free_top_kept_bytes);
}

}  // namespace gradhub
