#include "gpu_worker/ddp/comm/gloo/shared_memory_allreduce.h"

#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstring>
#include <fstream>
#include <functional>
#include <sstream>

#include "gpu_worker/ddp/comm/checks.h"
#include "gpu_worker/ddp/comm/gloo/shared_memory_files.h"

namespace gradhub::ddp {
namespace {

using detail::StrCat;
using Clock = std::chrono::steady_clock;

// Control words of different ranks on different 128-byte lines: adjacent-line prefetch pairs
// 64-byte lines, and a peer's spinning load must not keep stealing the line a rank writes.
constexpr size_t kLine = 128;
constexpr size_t kPage = 4096;
constexpr int kBuffers = 3;  // see the pipeline in the header
// Per slot. Measured with tests/bench/allreduce on 2 ranks (2 cores), 256 KiB / 512 KiB /
// 1 MiB / 2 MiB, median of 3 seconds per allreduce: 8 MiB 5.3 / 4.0 / 3.9 / 7.2 ms, 1 MiB and
// 25 MiB within noise except 2 MiB, the slowest. Smaller chunks pay more barriers; larger
// ones fall out of L2 between copy-in and reduce.
constexpr size_t kMaxChunkBytes = 512 << 10;
// A rank reduces its sub-slice in blocks of this size and copies each block's result into its
// tensor right after, from L1 (L1d is 32-48 KiB on current x86 cores).
constexpr size_t kReduceBlockBytes = 16 << 10;
// Slots of one segment, all ranks together: with many ranks on a host the chunk shrinks so
// the segment stays small (and fits Docker's default 64 MiB /dev/shm several times over).
constexpr size_t kMaxSlotBytes = 16 << 20;
// After a barrier's spin, a waiter sleeps at most this long before it checks that the peer it
// waits for still exists.
constexpr auto kLivenessInterval = std::chrono::milliseconds(100);
constexpr uint64_t kMagic = 0x6772616468756231;  // "gradhub1"

// How long a waiter spins before FUTEX_WAIT. Two ranks on two cores share them with the
// autograd threads: a long spin takes a core from the backward pass of its own or the peer's
// process, a short one saves the futex round trip when the peer arrives within microseconds.
// Median DDP step (tests/bench/ddp, 784-1024-1024-10, world 2, 5 runs each, interleaved) with
// 0 / 20 / 100 / 300 us: 27.9 / 26.7 / 25.6 / 26.1 ms, differences near the noise.
constexpr auto kSpin = std::chrono::microseconds(100);

struct Header {
  uint64_t magic;
  uint64_t bytes;
  uint64_t chunk_bytes;
  int32_t size;
};
static_assert(sizeof(Header) <= kLine);

struct RankControl {
  // Futex word: the number of the last barrier this rank reached (wraps; compared modulo 2^32).
  std::atomic<uint32_t> arrived;
  // Peers in FUTEX_WAIT on `arrived`: the rank that advances it skips FUTEX_WAKE when none.
  std::atomic<uint32_t> sleepers;
  std::atomic<int32_t> pid;
  // The call this rank is in (Describe): see OperationWord.
  std::atomic<uint64_t> operation;
};
static_assert(sizeof(RankControl) <= kLine);
static_assert(std::atomic<uint32_t>::is_always_lock_free &&
                  std::atomic<int32_t>::is_always_lock_free &&
                  std::atomic<uint64_t>::is_always_lock_free,
              "atomics in shared memory must be lock-free to work across processes");

struct Layout {
  size_t chunk_bytes;
  size_t slots_offset;
  size_t bytes;
};

Layout LayoutFor(int size) {
  Layout layout;
  layout.chunk_bytes =
      std::max(kPage, std::min(kMaxChunkBytes, kMaxSlotBytes / (kBuffers * size)) / kPage * kPage);
  layout.slots_offset = (kLine + size * kLine + kPage - 1) / kPage * kPage;
  layout.bytes = layout.slots_offset + size * kBuffers * layout.chunk_bytes;
  return layout;
}

RankControl& Control(void* base, int rank) {
  return *reinterpret_cast<RankControl*>(static_cast<uint8_t*>(base) + kLine + rank * kLine);
}

bool Reached(const RankControl& control, uint32_t target) {
  return static_cast<int32_t>(control.arrived.load(std::memory_order_acquire) - target) >= 0;
}

// A call's description in one word: count, element size, in place or staged.
uint64_t OperationWord(bool in_place, size_t count, size_t element_size) {
  return (static_cast<uint64_t>(count) << 8) | (element_size << 1) | (in_place ? 1 : 0);
}

std::string DescribeOperation(uint64_t word) {
  return StrCat((word & 1) != 0 ? "in place" : "staged", ", ", word >> 8, " elements of ",
                (word & 0xff) >> 1, " bytes");
}

void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

std::string ReadFirstLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

// Whether process `pid` (of this pid namespace) has exited: gone, or a zombie that its parent
// has not reaped yet (killed while its launcher was busy: without this the timeout decides).
bool ProcessExited(pid_t pid) {
  if (kill(pid, 0) != 0) return errno == ESRCH;
  // The state follows the command name, which may itself hold ") ": find the last one.
  const std::string stat = ReadFirstLine("/proc/" + std::to_string(pid) + "/stat");
  const size_t name_end = stat.rfind(") ");
  return name_end != std::string::npos && name_end + 2 < stat.size() && stat[name_end + 2] == 'Z';
}

std::string ReadLink(const char* path) {
  char target[256];
  const ssize_t n = readlink(path, target, sizeof(target));
  return n > 0 ? std::string(target, static_cast<size_t>(n)) : std::string();
}

// Ranks that agree on all of these can map one file of one tmpfs, and can see each other's
// pids; "" when any is unknown (then the group uses TCP).
std::string HostIdentity() {
  char hostname[256] = {};
  if (gethostname(hostname, sizeof(hostname) - 1) != 0) return "";
  const std::string boot_id = ReadFirstLine("/proc/sys/kernel/random/boot_id");
  const std::string pid_ns = ReadLink("/proc/self/ns/pid");
  const std::string mnt_ns = ReadLink("/proc/self/ns/mnt");
  // Ranks in different network namespaces are on different hosts as far as the job is
  // concerned (containers, or the test harness's hosts): their allreduce crosses the network.
  const std::string net_ns = ReadLink("/proc/self/ns/net");
  if (boot_id.empty() || pid_ns.empty() || mnt_ns.empty() || net_ns.empty()) return "";
  return StrCat(hostname, " ", boot_id, " ", pid_ns, " ", mnt_ns, " ", net_ns);
}

std::vector<std::string> Split(const std::string& text, char separator) {
  std::vector<std::string> parts;
  std::istringstream in(text);
  for (std::string part; std::getline(in, part, separator);) parts.push_back(part);
  return parts;
}

}  // namespace

SharedMemoryAllReduce::SharedMemoryAllReduce(void* base, size_t bytes, int rank, int size,
                                             size_t chunk_bytes)
    : base_(base),
      bytes_(bytes),
      rank_(rank),
      size_(size),
      chunk_bytes_(chunk_bytes),
      slots_offset_(LayoutFor(size).slots_offset) {}

SharedMemoryAllReduce::~SharedMemoryAllReduce() { munmap(base_, bytes_); }

uint8_t* SharedMemoryAllReduce::Slot(int rank, uint64_t chunk) const {
  return static_cast<uint8_t*>(base_) + slots_offset_ +
         (static_cast<size_t>(rank) * kBuffers + chunk % kBuffers) * chunk_bytes_;
}

void SharedMemoryAllReduce::Barrier(Clock::time_point deadline, std::chrono::milliseconds timeout,
                                    size_t index, size_t count) {
  const uint32_t target = ++barriers_;
  RankControl& mine = Control(base_, rank_);
  // seq_cst on both sides (here and the waiter's sleepers increment, then re-check): either
  // this sees the sleeper or the sleeper sees the new value, so no wake-up is lost.
  mine.arrived.store(target, std::memory_order_seq_cst);
  if (mine.sleepers.load(std::memory_order_seq_cst) != 0) {
    syscall(SYS_futex, &mine.arrived, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
  }
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_) continue;
    RankControl& theirs = Control(base_, peer);
    const auto spin_end = Clock::now() + kSpin;
    for (int i = 0; !Reached(theirs, target); ++i) {
      if ((i & 63) == 0 && Clock::now() >= spin_end) break;
      CpuRelax();
    }
    while (!Reached(theirs, target)) {
      const auto now = Clock::now();
      if (now >= deadline) {
        throw CommError(StrCat("timed out after ", timeout.count(), " ms waiting for rank ", peer,
                               " at barrier ", index + 1, " of ", count,
                               " of the shared-memory allreduce"));
      }
      const auto slice = std::min<Clock::duration>(deadline - now, kLivenessInterval);
      const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(slice).count();
      const timespec relative{static_cast<time_t>(ns / 1000000000),
                              static_cast<long>(ns % 1000000000)};
      theirs.sleepers.fetch_add(1, std::memory_order_seq_cst);
      const uint32_t seen = theirs.arrived.load(std::memory_order_seq_cst);
      if (static_cast<int32_t>(seen - target) < 0) {
        // Returns on a wake, a change of the word, a signal or the slice's end: all re-checked.
        syscall(SYS_futex, &theirs.arrived, FUTEX_WAIT, seen, &relative, nullptr, 0);
      }
      theirs.sleepers.fetch_sub(1, std::memory_order_seq_cst);
      if (Reached(theirs, target)) break;
      const int32_t pid = theirs.pid.load(std::memory_order_relaxed);
      if (ProcessExited(pid)) {
        throw CommError(StrCat("rank ", peer, " (pid ", pid, ") exited while the shared-memory ",
                               "allreduce waited for it at barrier ", index + 1, " of ", count));
      }
    }
  }
}

SharedMemoryAllReduce::SubSlice SharedMemoryAllReduce::SubSliceOf(size_t elements, int rank,
                                                                  size_t element_size) const {
  // Sub-slices start on 64-byte boundaries so the reduce loops run on aligned vectors.
  const size_t granule = 64 / element_size;
  const size_t per = ((elements + size_ - 1) / size_ + granule - 1) / granule * granule;
  const size_t begin = std::min(rank * per, elements);
  return {begin, std::min(begin + per, elements)};
}

void SharedMemoryAllReduce::CopyIn(const uint8_t* chunk, uint64_t number, size_t elements,
                                   size_t element_size) {
  const SubSlice own = SubSliceOf(elements, rank_, element_size);
  uint8_t* slot = Slot(rank_, number);
  std::memcpy(slot, chunk, own.begin * element_size);
  std::memcpy(slot + own.end * element_size, chunk + own.end * element_size,
              (elements - own.end) * element_size);
}

void SharedMemoryAllReduce::Reduce(uint8_t* chunk, uint64_t number, size_t elements,
                                   const detail::ReduceKernel& kernel) {
  const size_t element = kernel.element_size;
  const SubSlice own = SubSliceOf(elements, rank_, element);
  const size_t block = kReduceBlockBytes / element;
  for (size_t begin = own.begin; begin < own.end; begin += block) {
    const size_t n = std::min(block, own.end - begin);
    const size_t offset = begin * element;
    auto values_of = [&](int rank) {
      return rank == rank_ ? chunk + offset : Slot(rank, number) + offset;
    };
    uint8_t* out = Slot(rank_, number) + offset;
    kernel.reduce(out, values_of(0), values_of(1), n);
    for (int peer = 2; peer < size_; ++peer) kernel.reduce(out, out, values_of(peer), n);
    if (kernel.divide != nullptr) kernel.divide(out, n, size_);
    // This rank's own result, while the block is still in L1.
    std::memcpy(chunk + offset, out, n * element);
  }
}

void SharedMemoryAllReduce::CopyOut(uint8_t* chunk, uint64_t number, size_t elements,
                                    size_t element_size) const {
  for (int rank = 0; rank < size_; ++rank) {
    if (rank == rank_) continue;  // Reduce wrote it
    const SubSlice result = SubSliceOf(elements, rank, element_size);
    std::memcpy(chunk + result.begin * element_size,
                Slot(rank, number) + result.begin * element_size,
                (result.end - result.begin) * element_size);
  }
}

void SharedMemoryAllReduce::Describe(bool in_place, size_t count, size_t element_size) {
  // Relaxed: the barrier's release store that follows publishes it.
  Control(base_, rank_)
      .operation.store(OperationWord(in_place, count, element_size), std::memory_order_relaxed);
}

void SharedMemoryAllReduce::CheckPeersMatch() const {
  // A peer rewrites its word only for its next call, after the last barrier of this one,
  // which this rank has not reached yet: the words read here are this call's.
  const uint64_t mine = Control(base_, rank_).operation.load(std::memory_order_relaxed);
  for (int peer = 0; peer < size_; ++peer) {
    const uint64_t theirs = Control(base_, peer).operation.load(std::memory_order_relaxed);
    if (theirs != mine) {
      throw CommError(StrCat("rank ", peer, " ran another shared-memory allreduce (",
                             DescribeOperation(theirs), ") than rank ", rank_, " (",
                             DescribeOperation(mine),
                             "): every rank must issue the same collectives, on tensors"
                             " allocated alike, in the same order"));
    }
  }
}

void SharedMemoryAllReduce::AllReduceInPlace(const std::vector<uint8_t*>& ranks, size_t count,
                                             const detail::ReduceKernel& kernel,
                                             std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  const size_t element = kernel.element_size;
  // Step 1.
  Describe(/*in_place=*/true, count, element);
  Barrier(deadline, timeout, 0, 2);
  CheckPeersMatch();
  // Step 2.
  alignas(64) uint8_t result[kReduceBlockBytes];
  const SubSlice own = SubSliceOf(count, rank_, element);
  const size_t block = kReduceBlockBytes / element;
  for (size_t begin = own.begin; begin < own.end; begin += block) {
    const size_t n = std::min(block, own.end - begin);
    const size_t offset = begin * element;
    // Into this rank's own copy when its own value is read by the first step (ranks 0 and
    // 1), else into a block on the stack: one pass over memory fewer.
    uint8_t* out = rank_ < 2 ? ranks[rank_] + offset : result;
    kernel.reduce(out, ranks[0] + offset, ranks[1] + offset, n);
    for (int peer = 2; peer < size_; ++peer) kernel.reduce(out, out, ranks[peer] + offset, n);
    if (kernel.divide != nullptr) kernel.divide(out, n, size_);
    for (int rank = 0; rank < size_; ++rank) {
      if (ranks[rank] + offset != out) std::memcpy(ranks[rank] + offset, out, n * element);
    }
  }
  // Step 3.
  Barrier(deadline, timeout, 1, 2);
}

void SharedMemoryAllReduce::AllReduce(void* data, size_t count, const detail::ReduceKernel& kernel,
                                      std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  const size_t element = kernel.element_size;
  const size_t chunk_elements = chunk_bytes_ / element;
  const size_t chunks = (count + chunk_elements - 1) / chunk_elements;
  auto* bytes = static_cast<uint8_t*>(data);
  const uint64_t first = chunks_;
  auto elements_of = [&](size_t k) { return std::min(chunk_elements, count - k * chunk_elements); };
  auto chunk_at = [&](size_t k) { return bytes + k * chunk_bytes_; };

  Describe(/*in_place=*/false, count, element);
  for (size_t phase = 0; phase <= chunks + 1; ++phase) {
    if (phase >= 1 && phase <= chunks) {
      Reduce(chunk_at(phase - 1), first + phase - 1, elements_of(phase - 1), kernel);
    }
    if (phase >= 2)
      CopyOut(chunk_at(phase - 2), first + phase - 2, elements_of(phase - 2), element);
    if (phase < chunks) CopyIn(chunk_at(phase), first + phase, elements_of(phase), element);
    if (phase <= chunks) Barrier(deadline, timeout, phase, chunks + 1);
    if (phase == 0) CheckPeersMatch();
  }
  chunks_ += chunks;
}

namespace {

// Step 1: whether every rank asked for shared memory and runs on this host (and size >= 2).
bool SameHostEverywhere(const SharedMemorySetup::Options& options) {
  options.store->Set(StrCat(options.prefix, "host/", options.rank),
                     options.enabled ? HostIdentity() : "");
  bool eligible = options.size >= 2;
  std::string first_identity;
  for (int r = 0; r < options.size; ++r) {
    const std::string identity =
        options.store->Get(StrCat(options.prefix, "host/", r), options.timeout);
    if (r == 0) first_identity = identity;
    eligible = eligible && !identity.empty() && identity == first_identity;
  }
  return eligible;
}

// Step 2 on rank 0: creates, sizes and maps each segment file, hands each mapping to `adopt`
// and adds each path to `created`. Returns why it failed, or "".
std::string CreateSegmentFiles(const SharedMemorySetup::Options& options, const Layout& layout,
                               const std::function<void(void*)>& adopt,
                               std::vector<std::string>& created) {
  for (int i = 0; i < options.segments; ++i) {
    std::string path, failure;
    void* base = detail::CreateSharedFile(options.directory, layout.bytes, path, failure);
    if (!path.empty()) created.push_back(path);
    if (base == nullptr) return failure;
    adopt(base);
    *static_cast<Header*>(base) = Header{kMagic, layout.bytes, layout.chunk_bytes, options.size};
  }
  return "";
}

// Step 3 on the other ranks: opens and maps each of `paths`, hands each mapping to `adopt`
// and checks its header. Returns why it failed, or "".
std::string OpenSegmentFiles(const std::vector<std::string>& paths, const Layout& layout, int size,
                             const std::function<void(void*)>& adopt) {
  for (const auto& path : paths) {
    std::string failure;
    void* base = detail::OpenSharedFile(path, layout.bytes, failure);
    if (base == nullptr) return failure;
    adopt(base);
    const Header& header = *static_cast<const Header*>(base);
    if (header.magic != kMagic || header.bytes != layout.bytes ||
        header.chunk_bytes != layout.chunk_bytes || header.size != size) {
      return StrCat(path, " is not a segment of this group (header mismatch)");
    }
  }
  return "";
}

}  // namespace

SharedMemorySetup SharedMemorySetup::Establish(const Options& options) {
  SharedMemorySetup setup;
  if (!SameHostEverywhere(options)) return setup;  // a choice or several hosts: not logged
  const Layout layout = LayoutFor(options.size);
  auto adopt = [&](void* base) {
    setup.segments.emplace_back(new SharedMemoryAllReduce(base, layout.bytes, options.rank,
                                                          options.size, layout.chunk_bytes));
  };
  std::vector<std::string> created;  // rank 0's files, unlinked however this returns
  struct UnlinkAll {
    std::vector<std::string>& paths;
    ~UnlinkAll() {
      for (const auto& path : paths) unlink(path.c_str());
    }
  } unlink_all{created};

  const std::string segments_key = options.prefix + "segments";
  std::string failure;
  if (options.rank == 0) {
    failure = CreateSegmentFiles(options, layout, adopt, created);
    std::string value;
    for (const auto& path : created) value += path + "\n";
    if (!failure.empty()) {
      setup.segments.clear();
      setup.failure = "rank 0: " + failure;
      value = "!" + setup.failure;
    }
    options.store->Set(segments_key, value);
    if (!setup.failure.empty()) return setup;
  } else {
    const std::string value = options.store->Get(segments_key, options.timeout);
    if (!value.empty() && value[0] == '!') {
      setup.failure = value.substr(1);
      return setup;
    }
    failure = OpenSegmentFiles(Split(value, '\n'), layout, options.size, adopt);
    if (!failure.empty()) failure = StrCat("rank ", options.rank, ": ", failure);
  }
  setup.ShareOutcome(options, failure);
  return setup;
}

void SharedMemorySetup::ShareOutcome(const Options& options, const std::string& own_failure) {
  // Steps 3 and 4.
  for (auto& segment : segments) {
    Control(segment->base_, options.rank).pid.store(getpid(), std::memory_order_relaxed);
  }
  options.store->Set(StrCat(options.prefix, "mapped/", options.rank), own_failure);
  for (int r = 0; r < options.size; ++r) {
    const std::string reason =
        options.store->Get(StrCat(options.prefix, "mapped/", r), options.timeout);
    if (failure.empty() && !reason.empty()) failure = reason;
  }
  if (!failure.empty()) segments.clear();
}

}  // namespace gradhub::ddp
