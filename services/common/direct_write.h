// Writing large files around the page cache (O_DIRECT), for bytes written once and read
// rarely: checkpoint blobs in gradhub-checkpoint and their copies in a node's cache.
//
// Why: caching such a file only evicts what other processes use, and the cost of a buffered
// write is not the copy but finding fresh pages. On a VM, once the cache outgrows the memory it
// recycles, dd's own buffered write of 256 MiB with fsync fell from 1.3 GB/s to 90-170 MB/s
// here, while O_DIRECT stayed at about 1 GB/s with half the CPU (DMA instead of a copy).
//
// Append(file, data, held, path) on a direct descriptor appends `data` at `held`, the file's
// size. Data in block-aligned memory (AlignedBuffer) appended at a block boundary goes to the
// device as it is, its whole blocks in one write. Other data goes in pieces of at most
// kDirectStagingBytes through a page-aligned staging buffer kept per thread:
//   1. a piece starts at the block boundary at or below the file's end, with the bytes of that
//      partial block read back first (only after an append that ended mid-block);
//   2. its whole blocks go out with O_DIRECT, straight to the device;
//   3. a tail shorter than a block goes through the page cache (O_DIRECT switched off on the
//      descriptor), so the file never holds padding and its size is always the bytes written.
// A short direct write, or a device that refuses an aligned one, finishes the append buffered.
//
// DirectFileReader reads such a file back the same way, once and in order (a download, a
// scrub). Through the page cache the kernel first finds fresh pages for every byte, then copies
// it out of them, and keeps the file cached for nobody: gradhub-checkpoint spent 0.52-0.69 s of
// CPU per 256 MiB download that way here, 0.28-0.30 s reading direct (tests/bench/checkpoint,
// both in alternate rounds of one run).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace gradhub {

// Direct I/O wants buffers, offsets and lengths aligned to the device's logical block; 4096
// covers 512-byte and 4K devices alike.
inline constexpr size_t kDirectAlignment = 4096;
inline constexpr size_t kDirectStagingBytes = 4 << 20;

// Bytes in memory aligned to kDirectAlignment, appended to up to a capacity that grows on
// demand: what Append writes without staging. Kept and reused, it also spares the page faults
// of fresh memory per write. Move-only.
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  AlignedBuffer(AlignedBuffer&& other) noexcept;
  AlignedBuffer& operator=(AlignedBuffer&& other) noexcept;
  ~AlignedBuffer();

  // Room for at least `bytes` in all; what it holds is kept. Throws std::bad_alloc.
  void Reserve(size_t bytes);
  // Appends `bytes`, growing as needed; returns where they start in view().
  size_t Append(std::string_view bytes);
  // Keeps the first `bytes` only.
  void Truncate(size_t bytes) { size_ = std::min(size_, bytes); }
  char* data() { return data_; }
  std::string_view view() const { return {data_, size_}; }
  size_t size() const { return size_; }

 private:
  char* data_ = nullptr;
  size_t size_ = 0;
  size_t capacity_ = 0;
};

struct OpenedForWrite {
  int fd = -1;
  bool direct = false;  // opened with O_DIRECT
};

// open(path, flags | O_RDWR | O_CLOEXEC [| O_DIRECT], mode): with O_DIRECT when `direct` and
// the filesystem allows it (read and write: an append that starts mid-block reads that block
// back). The caller closes the descriptor.
absl::StatusOr<OpenedForWrite> OpenForWrite(const std::string& path, int flags, int mode,
                                            bool direct);

// Appends `data` at `held`, the file's size, the way `file` was opened: the protocol above
// when it is direct, plain pwrites (WriteAll) when the filesystem had no O_DIRECT.
absl::Status Append(const OpenedForWrite& file, std::string_view data, int64_t held,
                    const std::string& path);

// Reads a file in order from an offset, with O_DIRECT when `direct` and the filesystem allows
// it. Not thread-safe. Each Read:
//   1. direct: reads whole blocks, from the block boundary at or below the position, into a
//      block-aligned buffer it keeps, and hands out the bytes from the position on;
//   2. otherwise plain preads: a filesystem without O_DIRECT (open says EINVAL), a device that
//      refuses an aligned read (EINVAL; the descriptor then drops O_DIRECT), or `direct` false.
class DirectFileReader {
 public:
  // NOT_FOUND when `path` does not exist; OUT_OF_RANGE when `offset` is beyond its end.
  static absl::StatusOr<std::unique_ptr<DirectFileReader>> Open(const std::string& path,
                                                                int64_t offset, bool direct);
  ~DirectFileReader();
  DirectFileReader(const DirectFileReader&) = delete;
  DirectFileReader& operator=(const DirectFileReader&) = delete;

  // The next bytes into *out: `max_bytes` of them, fewer only at the end of the file.
  absl::Status Read(size_t max_bytes, std::string* out);
  // The file's size when it was opened.
  int64_t size() const { return size_; }
  bool direct() const { return direct_; }

 private:
  DirectFileReader(int fd, bool direct, int64_t size, int64_t position, std::string path)
      : fd_(fd), direct_(direct), size_(size), position_(position), path_(std::move(path)) {}
  // One read at the position: bytes handed out, 0 at the end of the file.
  absl::StatusOr<size_t> ReadDirect(size_t max_bytes, std::string* out);
  absl::StatusOr<size_t> ReadBuffered(size_t max_bytes, std::string* out);

  const int fd_;
  bool direct_;
  const int64_t size_;
  int64_t position_;
  const std::string path_;
  AlignedBuffer blocks_;  // direct reads land here
};

// pwrite until everything is written (EINTR and short writes retried).
absl::Status WriteAll(int fd, std::string_view data, int64_t offset, const std::string& path);

}  // namespace gradhub
