#include "gpu_worker/ddp/pipeline/allocation_counter.h"

namespace gradhub::ddp::pipeline {

void AllocationCounter::Reporter::reportMemoryUsage(void* /*ptr*/, int64_t alloc_size,
                                                    int64_t /*total_allocated*/,
                                                    int64_t /*total_reserved*/,
                                                    c10::Device /*device*/) {
  net_bytes.fetch_add(alloc_size, std::memory_order_relaxed);
}

AllocationCounter::AllocationCounter() : reporter_(std::make_shared<Reporter>()) {
  if (c10::ThreadLocalDebugInfo::get(c10::DebugInfoKind::PROFILER_STATE) == nullptr) {
    guard_.emplace(c10::DebugInfoKind::PROFILER_STATE, reporter_);
  }
}

AllocationCounter::~AllocationCounter() = default;

}  // namespace gradhub::ddp::pipeline
