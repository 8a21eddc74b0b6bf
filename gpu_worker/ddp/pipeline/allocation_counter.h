// Counts the bytes that the current thread's tensors allocate and free, through the hook that
// c10's CPU and CUDA allocators call for memory profiling (the one torch.profiler's
// profile_memory uses). The pipeline stage measures each micro-batch's activations with it:
// the bytes its forward left allocated, which its backward frees.
//
// While a counter is active it is the thread's profiler state (c10::DebugInfoKind::
// PROFILER_STATE), which the autograd engine carries into its device threads. Where a
// profiler already holds that state, the counter steps aside: active() is false and it counts
// nothing, rather than hiding the profiler.
//
// While counting, c10's CPU allocator also keeps a size per block in a table of its own, and
// logs a warning ("Memory block of unknown size ...", at most once per 1000) when it frees a
// block allocated before counting began; a training process sees it about once.
//
// Thread-safe: the allocators may report from any thread that inherited the state.
#pragma once

#include <c10/core/Allocator.h>
#include <c10/util/ThreadLocalDebugInfo.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>

namespace gradhub::ddp::pipeline {

class AllocationCounter {
 public:
  // Starts counting on this thread until destruction.
  AllocationCounter();
  ~AllocationCounter();
  AllocationCounter(const AllocationCounter&) = delete;
  AllocationCounter& operator=(const AllocationCounter&) = delete;

  bool active() const { return guard_.has_value(); }
  // Allocated minus freed since construction (negative when more was freed).
  int64_t net_bytes() const { return reporter_->net_bytes.load(std::memory_order_relaxed); }

 private:
  struct Reporter : c10::MemoryReportingInfoBase {
    std::atomic<int64_t> net_bytes{0};
    void reportMemoryUsage(void* ptr, int64_t alloc_size, int64_t total_allocated,
                           int64_t total_reserved, c10::Device device) override;
    bool memoryProfilingEnabled() const override { return true; }
  };

  std::shared_ptr<Reporter> reporter_;
  std::optional<c10::DebugInfoGuard> guard_;
};

}  // namespace gradhub::ddp::pipeline
