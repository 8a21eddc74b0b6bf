#include "services/common/direct_write.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace gradhub {
namespace {

absl::Status Errno(const std::string& what, const std::string& path) {
  return absl::ErrnoToStatus(errno, absl::StrCat(what, " ", path));
}

// A page-aligned staging buffer per thread, kept between appends: a fresh one per chunk would
// cost page faults on every chunk.
class AlignedBuffer {
 public:
  char* Reserve(size_t bytes) {
    if (bytes > capacity_) {
      std::free(data_);
      capacity_ = (bytes + kDirectAlignment - 1) / kDirectAlignment * kDirectAlignment;
      data_ = static_cast<char*>(std::aligned_alloc(kDirectAlignment, capacity_));
      if (data_ == nullptr) capacity_ = 0;
    }
    return data_;
  }
  ~AlignedBuffer() { std::free(data_); }

 private:
  char* data_ = nullptr;
  size_t capacity_ = 0;
};

// Steps 1-3 for one piece of at most kDirectStagingBytes.
absl::Status AppendPiece(int fd, std::string_view data, int64_t held, const std::string& path) {
  thread_local AlignedBuffer staging;
  const int64_t start = held / kDirectAlignment * kDirectAlignment;
  const size_t head = static_cast<size_t>(held - start);
  const size_t total = head + data.size();
  char* buffer = staging.Reserve(kDirectStagingBytes + kDirectAlignment);
  if (buffer == nullptr) return absl::ResourceExhaustedError("no memory for a direct write");
  if (head > 0) {
    const ssize_t n = pread(fd, buffer, kDirectAlignment, start);
    if (n < 0) return Errno("read", path);
    if (static_cast<size_t>(n) < head) {
      return absl::DataLossError(
          absl::StrCat("read ", n, " of the ", head, " bytes at ", start, " of ", path));
    }
  }
  std::memcpy(buffer + head, data.data(), data.size());
  size_t written = 0;
  const size_t whole = total / kDirectAlignment * kDirectAlignment;
  while (written < whole) {
    const ssize_t n = pwrite(fd, buffer + written, whole - written, start + written);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EINVAL) return Errno("write", path);
    if (n <= 0) break;
    written += static_cast<size_t>(n);
    if (written % kDirectAlignment != 0) break;
  }
  if (written == total) return absl::OkStatus();
  const int flags = fcntl(fd, F_GETFL);
  if (flags < 0) return Errno("fcntl", path);
  if ((flags & O_DIRECT) != 0 && fcntl(fd, F_SETFL, flags & ~O_DIRECT) != 0) {
    return Errno("fcntl", path);
  }
  absl::Status tail = WriteAll(fd, std::string_view(buffer + written, total - written),
                               start + static_cast<int64_t>(written), path);
  // Back to direct writes for the next piece (a device that refused one gets the next buffered
  // too: the fallback is per append, cheap to try again).
  if (tail.ok() && (flags & O_DIRECT) != 0) fcntl(fd, F_SETFL, flags);
  return tail;
}

}  // namespace

absl::StatusOr<OpenedForWrite> OpenForWrite(const std::string& path, int flags, int mode,
                                            bool direct) {
  const int base = flags | O_RDWR | O_CLOEXEC;
  if (direct) {
    const int fd = open(path.c_str(), base | O_DIRECT, mode);
    if (fd >= 0) return OpenedForWrite{fd, true};
    if (errno != EINVAL) return Errno("open", path);  // EINVAL: no O_DIRECT on this filesystem
  }
  const int fd = open(path.c_str(), base, mode);
  if (fd < 0) return Errno("open", path);
  return OpenedForWrite{fd, false};
}

absl::Status Append(const OpenedForWrite& file, std::string_view data, int64_t held,
                    const std::string& path) {
  if (!file.direct) return WriteAll(file.fd, data, held, path);
  const int fd = file.fd;
  while (!data.empty()) {
    // Pieces end on block boundaries of the file, so only the first may start mid-block.
    const size_t head = static_cast<size_t>(held % static_cast<int64_t>(kDirectAlignment));
    const size_t piece = std::min(data.size(), kDirectStagingBytes - head);
    const absl::Status appended = AppendPiece(fd, data.substr(0, piece), held, path);
    if (!appended.ok()) return appended;
    data.remove_prefix(piece);
    held += static_cast<int64_t>(piece);
  }
  return absl::OkStatus();
}

absl::Status WriteAll(int fd, std::string_view data, int64_t offset, const std::string& path) {
  while (!data.empty()) {
    const ssize_t n = pwrite(fd, data.data(), data.size(), offset);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Errno("write", path);
    data.remove_prefix(static_cast<size_t>(n));
    offset += n;
  }
  return absl::OkStatus();
}

}  // namespace gradhub
