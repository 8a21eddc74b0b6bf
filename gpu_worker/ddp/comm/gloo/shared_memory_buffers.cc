#include "gpu_worker/ddp/comm/gloo/shared_memory_buffers.h"

#include <ATen/ops/from_blob.h>
#include <ATen/ops/zeros.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <iterator>
#include <utility>

#include "gpu_worker/ddp/comm/checks.h"
#include "gpu_worker/ddp/comm/gloo/shared_memory_files.h"
#include "gpu_worker/ddp/comm/work.h"

namespace gradhub::ddp {
namespace {

using detail::StrCat;

constexpr size_t kPage = 4096;

// Why this rank keeps its buffers private, or "".
std::string PrivateMemoryCap() {
  rlimit limit{};
  if (getrlimit(RLIMIT_DATA, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return "";
  return StrCat("RLIMIT_DATA caps this rank's private memory at ", limit.rlim_cur,
                " bytes, and a buffer in shared memory would escape the cap");
}

// Why `bytes` more in `directory` would crowd out its other users (other jobs' segments,
// NCCL, data loaders: /dev/shm is the host's, or the container's), or "".
std::string RoomProblem(const std::string& directory, size_t bytes) {
  struct statvfs fs {};
  if (statvfs(directory.c_str(), &fs) != 0) return "";  // creating the file will say why
  const uint64_t unit = fs.f_frsize != 0 ? fs.f_frsize : fs.f_bsize;
  const uint64_t total = static_cast<uint64_t>(fs.f_blocks) * unit;
  const uint64_t free = static_cast<uint64_t>(fs.f_bavail) * unit;
  if (SharedMemoryBuffers::LeavesRoom(bytes, free, total)) return "";
  return StrCat(directory, " has ", free, " of ", total, " bytes free, and ", bytes,
                " more would leave less than max(64 MiB, a tenth of it) to its other users");
}

}  // namespace

bool SharedMemoryBuffers::LeavesRoom(uint64_t bytes, uint64_t free, uint64_t total) {
  const uint64_t reserve = std::max<uint64_t>(uint64_t{64} << 20, total / 10);
  return free >= reserve && free - reserve >= bytes;
}

// Every rank's mapping of one buffer, unmapped when the last tensor (or Copies) goes.
struct SharedMemoryBuffers::Region {
  size_t bytes = 0;
  std::vector<uint8_t*> ranks;  // null where not mapped
  std::string own_path;         // until step 3 unlinks it

  ~Region() {
    if (!own_path.empty()) unlink(own_path.c_str());
    for (uint8_t* base : ranks) {
      if (base != nullptr) munmap(base, bytes);
    }
  }
};

SharedMemoryBuffers::SharedMemoryBuffers(Options options) : options_(std::move(options)) {}

std::shared_ptr<SharedMemoryBuffers::Region> SharedMemoryBuffers::MapEveryRank(
    uint64_t index, size_t bytes, std::string& failure) {
  auto region = std::make_shared<Region>();
  region->bytes = bytes;
  region->ranks.assign(options_.size, nullptr);
  const std::string keys = StrCat(options_.prefix, index, "/");
  // Step 1.
  failure = PrivateMemoryCap();
  if (failure.empty()) failure = RoomProblem(options_.directory, bytes);
  if (failure.empty()) {
    void* own = detail::CreateSharedFile(options_.directory, bytes, region->own_path, failure);
    region->ranks[options_.rank] = static_cast<uint8_t*>(own);
  }
  if (!failure.empty()) failure = StrCat("rank ", options_.rank, ": ", failure);
  options_.store->Set(StrCat(keys, "path/", options_.rank),
                      failure.empty() ? region->own_path : "!" + failure);
  // Step 2: every path is read, a failure or not, so that no key is left unread.
  std::vector<std::string> paths(options_.size);
  for (int r = 0; r < options_.size; ++r) {
    paths[r] = options_.store->Get(StrCat(keys, "path/", r), options_.timeout);
    if (failure.empty() && !paths[r].empty() && paths[r][0] == '!') failure = paths[r].substr(1);
  }
  for (int r = 0; r < options_.size && failure.empty(); ++r) {
    if (r == options_.rank) continue;
    void* peer = detail::OpenSharedFile(paths[r], bytes, failure);
    region->ranks[r] = static_cast<uint8_t*>(peer);
    if (!failure.empty()) failure = StrCat("rank ", options_.rank, ": ", failure);
  }
  return region;
}

std::string SharedMemoryBuffers::AgreedFailure(uint64_t index, const std::string& own_failure) {
  const std::string keys = StrCat(options_.prefix, index, "/mapped/");
  options_.store->Set(StrCat(keys, options_.rank), own_failure);
  std::string failure;
  for (int r = 0; r < options_.size; ++r) {
    const std::string reason = options_.store->Get(StrCat(keys, r), options_.timeout);
    if (failure.empty()) failure = reason;
  }
  return failure;
}

at::Tensor SharedMemoryBuffers::Allocate(int64_t numel, const at::TensorOptions& options) {
  const size_t bytes = static_cast<size_t>(numel) * options.dtype().itemsize();
  if (bytes == 0) return at::zeros({numel}, options);
  const uint64_t index = allocations_++;
  std::shared_ptr<Region> region;
  std::string failure;
  try {
    region = MapEveryRank(index, (bytes + kPage - 1) / kPage * kPage, failure);
    failure = AgreedFailure(index, failure);
  } catch (const std::exception& e) {
    throw CommError(StrCat(options_.who, ": allocating a shared-memory buffer (store keys '",
                           options_.prefix, index, "/*') failed: ", e.what()));
  }
  // Step 3.
  if (!region->own_path.empty()) unlink(region->own_path.c_str());
  region->own_path.clear();
  if (!failure.empty()) {
    if (options_.rank == 0 && !logged_) {
      std::fprintf(stderr,
                   "%s: gradient buckets stay in private memory (allreduced through the "
                   "shared-memory segment): %s\n",
                   options_.who.c_str(), failure.c_str());
      logged_ = true;
    }
    return at::zeros({numel}, options);
  }
  uint8_t* own = region->ranks[options_.rank];
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Buffers gone are dropped first: one whose addresses the new mapping reuses would
    // otherwise hide it from Find.
    for (auto it = live_.begin(); it != live_.end();) {
      it = it->second.expired() ? live_.erase(it) : std::next(it);
    }
    live_[reinterpret_cast<uintptr_t>(own)] = region;
  }
  // The tensor owns the region; the registry only finds it while the tensor lives.
  return at::from_blob(
      own, {numel}, [region](void*) mutable { region.reset(); }, options);
}

std::optional<SharedMemoryBuffers::Copies> SharedMemoryBuffers::Find(const void* data,
                                                                     size_t bytes) const {
  const auto address = reinterpret_cast<uintptr_t>(data);
  std::shared_ptr<const Region> region;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.upper_bound(address);
    if (it == live_.begin()) return std::nullopt;
    --it;
    region = it->second.lock();
    if (region == nullptr || address + bytes > it->first + region->bytes) return std::nullopt;
  }
  const size_t offset = address - reinterpret_cast<uintptr_t>(region->ranks[options_.rank]);
  Copies copies;
  for (uint8_t* base : region->ranks) copies.ranks.push_back(base + offset);
  copies.keep = std::move(region);
  return copies;
}

}  // namespace gradhub::ddp
