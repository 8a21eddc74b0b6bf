#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "gpu_worker/ddp/store.h"

namespace gradhub::ddp {

// Tensors in shared memory that every rank of a group on one host maps: the Gloo group's
// ProcessGroup::AllocateCollectiveBuffer (NCCL's registered buffers, for CPU ranks). The
// Reducer's gradient buckets live there, so the shared-memory allreduce reduces straight from
// the peers' buckets into every rank's (SharedMemoryAllReduce::AllReduceInPlace): 2 bytes of
// memory traffic per byte of bucket instead of the 4 that staging a private tensor through
// the segment costs.
//
// Protocol of the n-th allocation (every rank allocates the same sizes in the same order):
//  1. Every rank creates a region of its own: a file "gradhub-<random 64-bit hex>" in
//     `directory`, O_EXCL, mode 0600, sized with posix_fallocate (a full tmpfs fails here, not
//     by SIGBUS later) and mapped. Its own, so that a memory cgroup charges each rank for its
//     own bucket, as it would a private one. It sets "<prefix><n>/path/<r>" to the path, or to
//     "!" + the reason it has none.
//  2. Every rank reads every path and, unless one is a reason, opens and maps each peer's file
//     and checks its size. It sets "<prefix><n>/mapped/<r>" to "" or to the reason it failed.
//  3. Every rank reads every "mapped" key, then unlinks its own file: the mappings keep the
//     memory from here, so a crash leaks nothing. Any reason on any rank makes every rank
//     unmap and return an ordinary tensor instead (the same decision everywhere, so every
//     rank reduces it the same way); rank 0 logs the first such reason once.
// A rank gives a reason in step 1 when its private memory is capped by RLIMIT_DATA (shared
// memory is outside that cap, gpu_worker/agent/memory_limit.h, and its buckets must stay
// inside), or when the region would leave `directory` less than max(64 MiB, a tenth of its
// size) free (LeavesRoom): /dev/shm is shared with other jobs' segments, NCCL, data loaders.
//
// Each rank keeps its mappings of a buffer while its tensor, or any view of it, lives. Thread-
// safe: Allocate on one thread (it talks to the store), Find from any.
class SharedMemoryBuffers {
 public:
  struct Options {
    std::shared_ptr<Store> store;  // kept: allocations come long after the rendezvous
    std::string prefix;            // e.g. "default/shm-buffers/"
    int rank = 0;
    int size = 1;
    std::string directory = "/dev/shm";
    std::chrono::milliseconds timeout{0};
    std::string who;  // "process group 'x' rank r/n": starts the log line and errors
  };
  explicit SharedMemoryBuffers(Options options);

  // `numel` zeroed elements of `options`' dtype, in shared memory when every rank could map
  // every rank's region, else at::zeros. Throws CommError when the store fails or a peer does
  // not come within the timeout.
  at::Tensor Allocate(int64_t numel, const at::TensorOptions& options);

  // Every rank's copy of [data, data + bytes), when that range lies in one live buffer this
  // allocated: `ranks[r]` is rank r's copy as mapped here. Keeping it keeps the mappings.
  struct Copies {
    std::shared_ptr<const void> keep;
    std::vector<uint8_t*> ranks;
  };
  std::optional<Copies> Find(const void* data, size_t bytes) const;

  // Whether taking `bytes` of a filesystem with `free` of `total` bytes free leaves it
  // max(64 MiB, total / 10).
  static bool LeavesRoom(uint64_t bytes, uint64_t free, uint64_t total);

 private:
  struct Region;
  // Steps 1-2 for allocation `index`; returns the mapped region or why there is none, and
  // publishes this rank's outcome of each step.
  std::shared_ptr<Region> MapEveryRank(uint64_t index, size_t bytes, std::string& failure);
  // Step 3: the first reason any rank gave, "" when every rank mapped every region.
  std::string AgreedFailure(uint64_t index, const std::string& own_failure);

  const Options options_;
  uint64_t allocations_ = 0;  // numbers the allocations, the same on every rank
  bool logged_ = false;       // rank 0 said once why a buffer is private
  mutable std::mutex mu_;
  std::map<uintptr_t, std::weak_ptr<Region>> live_;  // by this rank's base address
};

}  // namespace gradhub::ddp
