#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gpu_worker/ddp/comm/reduce_kernels.h"
#include "gpu_worker/ddp/store.h"

namespace gradhub::ddp {

// Allreduce through one shared-memory segment mapped by every rank of a group on one host
// (what NCCL's SHM transport and c10d's intra-node paths do): no sockets, so no kernel copies
// and no loopback TCP stack, which on a small machine is most of a TCP allreduce's cost.
//
// Segment layout (sized in the .cc; ~3 MiB for two ranks):
//   header | one control line per rank | slots[rank][3] of chunk_bytes each.
// A rank's control line holds its barrier counter (a futex word), how many peers sleep on it,
// and its pid (to notice a peer that died instead of waiting out the timeout).
//
// Algorithm, per chunk k of the tensor (chunk_bytes at most), in buffer b = k % 3. The chunk
// is cut into one sub-slice per rank; rank r reduces sub-slice r (a reduce-scatter, then an
// allgather, both through the slots):
//   CI(k) copy-in:  rank r copies every sub-slice of its chunk but its own into slots[r][b];
//                   its own sub-slice no peer reads, so it stays in its tensor.
//   R(k)  reduce:   rank r reduces sub-slice r over the ranks' values in rank order (its own
//                   read from its tensor, each peer's from slots[peer][b]) into slots[r][b]'s
//                   sub-slice r (then divides, for an average over n != 2), so every rank ends
//                   with bitwise-identical results; block by block, each block's result also
//                   copied into its tensor while it is in L1.
//   CO(k) copy-out: every rank copies each peer's sub-slice s of the result from slots[s][b]
//                   into its tensor.
// For two ranks each rank thus reads and writes 4 chunk-sizes of memory per chunk (copy-in and
// copy-out half each, the reduce's reads and write), where copying every sub-slice in and
// reducing into slots[0] took 5.5: the path is bound by memory traffic, not by its barriers.
// Each step needs the previous step of the same chunk done by every rank, so they are pipelined
// with one barrier per phase: phase p runs CO(p-2), R(p-1), CI(p), then a barrier. The three
// touch three different buffers, and a buffer is rewritten only three chunks later, after every
// rank passed a barrier that follows its last reader: K chunks take K + 1 barriers, not 2K.
// A rank's tensor is read by R(k) and rewritten only by CO(k), a barrier later. Chunks are
// numbered across calls, so a call may start while a peer still copies out the previous one's
// last chunk.
//
// A barrier: each rank stores the barrier's number into its counter (FUTEX_WAKE when a peer
// sleeps on it), then waits for every peer's counter to reach the number: a short spin, then
// FUTEX_WAIT (shared, not private: the waiters are in other processes) in slices, between
// which it checks that the peer's process still exists and is not a zombie (killed, not yet
// reaped by its launcher).
//
// In place (AllReduceInPlace), for a tensor that every rank holds in memory every rank maps
// (shared_memory_buffers.h: the gradient buckets), nothing is staged through the slots:
//   1. every rank describes the call in its control line, then a barrier: every input is
//      complete;
//   2. rank r reduces sub-slice r of the whole tensor, block by block, over the ranks' copies
//      in rank order into a block on its stack (in L1), and copies each result block into
//      every rank's copy. It reads S and writes S bytes (S = the tensor's size), against 4S
//      when staged, so it can approach one core's memcpy rate;
//   3. a barrier: every rank's copy holds every result, and no rank reads or writes a peer's
//      copy any more, so each may change its own (the next backward) once past it.
// Sub-slices are disjoint, so no two ranks write the same bytes.
//
// Both algorithms describe each call (in place or staged, count, element size) in the
// control line before their first barrier and compare the peers' descriptions after it: ranks
// that disagree (a bug, or tensors placed differently) fail with CommError naming both calls
// instead of pairing mismatched barriers and corrupting the results.
//
// Not thread-safe: one caller at a time (a GlooProcessGroup channel thread), and every rank
// must call AllReduce with the same count and kernel, in the same order.
class SharedMemoryAllReduce {
 public:
  ~SharedMemoryAllReduce();
  SharedMemoryAllReduce(const SharedMemoryAllReduce&) = delete;
  SharedMemoryAllReduce& operator=(const SharedMemoryAllReduce&) = delete;

  // Reduces `count` elements at `data` across the ranks in place, with `kernel` (see
  // reduce_kernels.h). Throws CommError when a peer does not arrive within `timeout` or its
  // process is gone; the segment is then out of step and must not be used again.
  void AllReduce(void* data, size_t count, const detail::ReduceKernel& kernel,
                 std::chrono::milliseconds timeout);

  // The same reduction for a tensor every rank's copy of which is mapped here: `ranks[r]` is
  // rank r's copy (`ranks[rank]` the caller's own), `count` elements each.
  void AllReduceInPlace(const std::vector<uint8_t*>& ranks, size_t count,
                        const detail::ReduceKernel& kernel, std::chrono::milliseconds timeout);

  size_t chunk_bytes() const { return chunk_bytes_; }

 private:
  friend struct SharedMemorySetup;
  SharedMemoryAllReduce(void* base, size_t bytes, int rank, int size, size_t chunk_bytes);

  struct SubSlice {
    size_t begin, end;  // elements of the chunk
  };
  // The part of a chunk of `elements` that `rank` reduces.
  SubSlice SubSliceOf(size_t elements, int rank, size_t element_size) const;
  uint8_t* Slot(int rank, uint64_t chunk) const;
  // The steps of chunk number `number` (counted across calls), whose tensor bytes are `chunk`.
  void CopyIn(const uint8_t* chunk, uint64_t number, size_t elements, size_t element_size);
  void Reduce(uint8_t* chunk, uint64_t number, size_t elements, const detail::ReduceKernel& kernel);
  void CopyOut(uint8_t* chunk, uint64_t number, size_t elements, size_t element_size) const;
  void Barrier(std::chrono::steady_clock::time_point deadline, std::chrono::milliseconds timeout,
               size_t index, size_t count);
  // Before the first barrier of a call: this call's description, for the peers to check.
  void Describe(bool in_place, size_t count, size_t element_size);
  // After it: throws CommError when a peer described another call.
  void CheckPeersMatch() const;

  void* const base_;
  const size_t bytes_;
  const int rank_, size_;
  const size_t chunk_bytes_;
  const size_t slots_offset_;
  uint32_t barriers_ = 0;  // barriers passed so far: the next one's number is barriers_ + 1
  uint64_t chunks_ = 0;    // chunks reduced so far, by every call (picks the buffer)
};

// The one-time agreement, through the store, on whether a group uses shared memory, and its
// segments (one per channel). Run by every rank right after the gloo rendezvous; every rank
// ends with the same decision.
//
// Protocol (keys under `prefix`, e.g. "default/shm/"):
//  1. Every rank sets "host/<r>" to its host identity (hostname, boot id, pid, mount and
//     network namespaces), or "" when options.shared_memory is false on it, and reads every rank's.
//     Unless all are equal and non-empty (and size >= 2), the group uses TCP; that is a choice
//     or a multi-host group, not a failure, and is not logged.
//  2. Rank 0 creates each segment: a file "gradhub-<random 64-bit hex>" in `directory`
//     (/dev/shm by default, which is what shm_open uses), O_EXCL, mode 0600, sized with
//     posix_fallocate (with ftruncate alone a full tmpfs -- Docker's /dev/shm is 64 MiB -- is
//     found only by SIGBUS on first touch), mapped, and its header written. It sets
//     "segments" to the paths, or to "!" + the reason it failed.
//  3. Every other rank reads "segments" and, unless it is a failure, opens and maps each path
//     and checks its size and header. Every rank writes its pid into its control lines and
//     sets "mapped/<r>" to "" or to the reason it failed.
//  4. Every rank reads every "mapped/<s>". Rank 0 then unlinks the files (each rank holds its
//     mapping, so from here a crash leaks nothing); it also unlinks them whenever it leaves
//     steps 2-4 by a failure. Any reason makes every rank unmap and use TCP, and rank 0 logs
//     it once on stderr.
// Every key a rank waits for is written by its owner on every path, so no rank waits for a key
// that will not come; a rank that does not come in time makes the store throw, and this
// throws CommError.
struct SharedMemorySetup {
  struct Options {
    std::shared_ptr<Store> store;
    std::string prefix;
    int rank = 0;
    int size = 1;
    int segments = 1;
    bool enabled = true;
    std::string directory = "/dev/shm";
    std::chrono::milliseconds timeout{0};
  };

  // Empty when the group uses TCP.
  std::vector<std::unique_ptr<SharedMemoryAllReduce>> segments;
  // Why the group uses TCP although every rank asked for shared memory on one host; empty
  // otherwise.
  std::string failure;

  static SharedMemorySetup Establish(const Options& options);

 private:
  // Steps 3 (the pids) and 4 of the protocol, after this rank mapped its segments or failed
  // with `failure`: publishes the outcome, reads every rank's, keeps the first failure.
  void ShareOutcome(const Options& options, const std::string& own_failure);
};

}  // namespace gradhub::ddp
