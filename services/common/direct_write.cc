#include "services/common/direct_write.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

#include "absl/strings/str_cat.h"

namespace gradhub {
namespace {

absl::Status Errno(const std::string& what, const std::string& path) {
  return absl::ErrnoToStatus(errno, absl::StrCat(what, " ", path));
}

// The whole blocks of `data`, block-aligned in memory and in the file, straight to the device.
// Returns how many bytes went out: fewer than the whole blocks when a write came back short or
// the device refused it (the caller writes the rest through the staging buffer).
absl::StatusOr<size_t> WriteAlignedBlocks(int fd, std::string_view data, int64_t held,
                                          const std::string& path) {
  const size_t whole = data.size() / kDirectAlignment * kDirectAlignment;
  size_t written = 0;
  while (written < whole) {
    const ssize_t n = pwrite(fd, data.data() + written, whole - written, held + written);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EINVAL) return Errno("write", path);
    if (n <= 0) break;
    written += static_cast<size_t>(n);
    if (written % kDirectAlignment != 0) break;
  }
  return written / kDirectAlignment * kDirectAlignment;
}

// Steps 1-3 for one piece of at most kDirectStagingBytes.
absl::Status AppendPiece(int fd, std::string_view data, int64_t held, const std::string& path) {
  // Kept per thread between appends: a fresh one per chunk would cost page faults every time.
  thread_local AlignedBuffer staging;
  const int64_t start = held / kDirectAlignment * kDirectAlignment;
  const size_t head = static_cast<size_t>(held - start);
  const size_t total = head + data.size();
  try {
    staging.Reserve(kDirectStagingBytes + kDirectAlignment);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError("no memory for a direct write");
  }
  char* buffer = staging.data();
  if (head > 0) {
    const ssize_t n = pread(fd, buffer, kDirectAlignment, start);
    if (n < 0) return Errno("read", path);
    if (static_cast<size_t>(n) < head) {
      return absl::DataLossError(
          absl::StrCat("read ", n, " of the ", head, " bytes at ", start, " of ", path));
    }
  }
  std::memcpy(buffer + head, data.data(), data.size());
  absl::StatusOr<size_t> direct =
      WriteAlignedBlocks(fd, std::string_view(buffer, total), start, path);
  if (!direct.ok()) return direct.status();
  const size_t written = *direct;
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

AlignedBuffer::AlignedBuffer(AlignedBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      capacity_(std::exchange(other.capacity_, 0)) {}

AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& other) noexcept {
  if (this != &other) {
    std::free(data_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    capacity_ = std::exchange(other.capacity_, 0);
  }
  return *this;
}

AlignedBuffer::~AlignedBuffer() { std::free(data_); }

void AlignedBuffer::Reserve(size_t bytes) {
  if (bytes <= capacity_) return;
  const size_t capacity = (bytes + kDirectAlignment - 1) / kDirectAlignment * kDirectAlignment;
  char* grown = static_cast<char*>(std::aligned_alloc(kDirectAlignment, capacity));
  if (grown == nullptr) throw std::bad_alloc();
  if (size_ > 0) std::memcpy(grown, data_, size_);
  std::free(data_);
  data_ = grown;
  capacity_ = capacity;
}

size_t AlignedBuffer::Append(std::string_view bytes) {
  const size_t at = size_;
  Reserve(size_ + bytes.size());
  if (!bytes.empty()) std::memcpy(data_ + at, bytes.data(), bytes.size());
  size_ += bytes.size();
  return at;
}

absl::Status Append(const OpenedForWrite& file, std::string_view data, int64_t held,
                    const std::string& path) {
  if (!file.direct) return WriteAll(file.fd, data, held, path);
  const int fd = file.fd;
  if (held % static_cast<int64_t>(kDirectAlignment) == 0 &&
      reinterpret_cast<uintptr_t>(data.data()) % kDirectAlignment == 0) {
    absl::StatusOr<size_t> written = WriteAlignedBlocks(fd, data, held, path);
    if (!written.ok()) return written.status();
    data.remove_prefix(*written);
    held += static_cast<int64_t>(*written);
  }
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

absl::StatusOr<std::unique_ptr<DirectFileReader>> DirectFileReader::Open(const std::string& path,
                                                                         int64_t offset,
                                                                         bool direct) {
  int fd = -1;
  if (direct) {
    fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
    // EINVAL: no O_DIRECT on this filesystem; any other error the plain open names again.
    if (fd < 0) direct = false;
  }
  if (fd < 0) fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0 && errno == ENOENT) return absl::NotFoundError(absl::StrCat(path, " not found"));
  if (fd < 0) return Errno("open", path);
  struct stat st;
  if (fstat(fd, &st) != 0) {
    absl::Status failed = Errno("stat", path);
    close(fd);
    return failed;
  }
  if (offset < 0 || offset > st.st_size) {
    close(fd);
    return absl::OutOfRangeError(
        absl::StrCat("offset ", offset, " is outside the ", st.st_size, " bytes of ", path));
  }
  if (!direct) posix_fadvise(fd, offset, 0, POSIX_FADV_SEQUENTIAL);
  return std::unique_ptr<DirectFileReader>(
      new DirectFileReader(fd, direct, st.st_size, offset, path));
}

DirectFileReader::~DirectFileReader() { close(fd_); }

absl::Status DirectFileReader::Read(size_t max_bytes, std::string* out) {
  out->clear();
  out->reserve(max_bytes);
  while (out->size() < max_bytes) {
    const size_t wanted = max_bytes - out->size();
    absl::StatusOr<size_t> got = direct_ ? ReadDirect(wanted, out) : ReadBuffered(wanted, out);
    if (!got.ok()) return got.status();
    if (*got == 0) break;
    position_ += static_cast<int64_t>(*got);
  }
  return absl::OkStatus();
}

absl::StatusOr<size_t> DirectFileReader::ReadDirect(size_t max_bytes, std::string* out) {
  const int64_t alignment = static_cast<int64_t>(kDirectAlignment);
  const int64_t start = position_ / alignment * alignment;  // step 1
  const size_t skip = static_cast<size_t>(position_ - start);
  const size_t length =
      (skip + max_bytes + kDirectAlignment - 1) / kDirectAlignment * kDirectAlignment;
  blocks_.Reserve(length);
  ssize_t n;
  do {
    n = pread(fd_, blocks_.data(), length, start);
  } while (n < 0 && errno == EINTR);
  if (n < 0 && errno == EINVAL) {  // step 2: the device wants no direct reads after all
    const int flags = fcntl(fd_, F_GETFL);
    if (flags < 0 || fcntl(fd_, F_SETFL, flags & ~O_DIRECT) != 0) return Errno("fcntl", path_);
    direct_ = false;
    return ReadBuffered(max_bytes, out);
  }
  if (n < 0) return Errno("read", path_);
  if (static_cast<size_t>(n) <= skip) return 0;  // the end of the file
  const size_t got = std::min(static_cast<size_t>(n) - skip, max_bytes);
  out->append(blocks_.data() + skip, got);
  return got;
}

absl::StatusOr<size_t> DirectFileReader::ReadBuffered(size_t max_bytes, std::string* out) {
  const size_t at = out->size();
  out->resize(at + max_bytes);
  ssize_t n;
  do {
    n = pread(fd_, out->data() + at, max_bytes, position_);
  } while (n < 0 && errno == EINTR);
  out->resize(at + static_cast<size_t>(std::max<ssize_t>(n, 0)));
  if (n < 0) return Errno("read", path_);
  return static_cast<size_t>(n);
}

}  // namespace gradhub
