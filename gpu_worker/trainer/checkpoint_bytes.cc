#include "gpu_worker/trainer/checkpoint_bytes.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <vector>

namespace gradhub::trainer {
namespace {

std::string ErrorText() { return std::strerror(errno); }

std::string Shown(const std::string& directory) {
  return directory.empty() ? "the current directory" : directory;
}

}  // namespace

// Owns a string, or a read-only mapping (unmapped when the last CheckpointBytes goes).
struct CheckpointBytes::Storage {
  std::string bytes;
  void* mapping = nullptr;
  size_t mapped_size = 0;

  Storage() = default;
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  ~Storage() {
    if (mapping != nullptr) munmap(mapping, mapped_size);
  }
};

namespace {

// `size` bytes of `fd` mapped read-only; an empty storage for 0 (mmap refuses a length of 0).
std::shared_ptr<CheckpointBytes::Storage> MapDescriptor(int fd, size_t size,
                                                        const std::string& what) {
  auto storage = std::make_shared<CheckpointBytes::Storage>();
  if (size == 0) return storage;
  void* mapping = mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  if (mapping == MAP_FAILED) {
    throw std::runtime_error("cannot map " + what + ": " + ErrorText());
  }
  // Read once, front to back (hashed, sent, uploaded): read ahead, and drop what was read.
  madvise(mapping, size, MADV_SEQUENTIAL);
  storage->mapping = mapping;
  storage->mapped_size = size;
  return storage;
}

}  // namespace

CheckpointBytes::CheckpointBytes(std::string bytes) {
  auto storage = std::make_shared<Storage>();
  storage->bytes = std::move(bytes);
  view_ = storage->bytes;
  storage_ = std::move(storage);
}

CheckpointBytes CheckpointBytes::MapFile(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error("cannot open " + path + ": " + ErrorText());
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    const std::string error = ErrorText();
    close(fd);
    throw std::runtime_error("cannot stat " + path + ": " + error);
  }
  std::shared_ptr<Storage> storage;
  try {
    storage = MapDescriptor(fd, static_cast<size_t>(st.st_size), path);
  } catch (...) {
    close(fd);
    throw;
  }
  close(fd);  // the mapping keeps the file
  const std::string_view view(static_cast<const char*>(storage->mapping), storage->mapped_size);
  return CheckpointBytes(std::move(storage), view);
}

std::string CheckpointBytes::Reclaim(CheckpointBytes bytes) {
  if (!bytes.storage_ || bytes.storage_.use_count() != 1 || bytes.mapped()) return {};
  // The last other holder let go with a release; this orders its reads of the bytes (an upload
  // on the writer's thread) before the writes into the string that follow.
  std::atomic_thread_fence(std::memory_order_acquire);
  // The sole holder: nothing can read the bytes any more, so they may change.
  std::string memory = std::move(const_cast<Storage&>(*bytes.storage_).bytes);
  memory.clear();
  return memory;
}

bool CheckpointBytes::mapped() const { return storage_ && storage_->mapping != nullptr; }

CheckpointBytes CheckpointBytes::Slice(size_t offset, size_t size) const {
  if (offset > view_.size() || size > view_.size() - offset) {
    throw std::out_of_range("bytes [" + std::to_string(offset) + ", +" + std::to_string(size) +
                            ") of " + std::to_string(view_.size()));
  }
  return CheckpointBytes(storage_, view_.substr(offset, size));
}

ScratchFile::ScratchFile(const std::string& directory) : directory_(directory) {
  std::string pattern = (directory.empty() ? std::string(".") : directory) + "/.gradhub-XXXXXX";
  std::vector<char> name(pattern.begin(), pattern.end());
  name.push_back('\0');
  fd_ = mkostemp(name.data(), O_CLOEXEC);
  if (fd_ < 0) {
    throw std::runtime_error("cannot create a scratch file in " + Shown(directory) + ": " +
                             ErrorText());
  }
  unlink(name.data());  // nameless from here on: gone when the last descriptor or mapping is
}

ScratchFile::~ScratchFile() {
  if (fd_ >= 0) close(fd_);
}

void ScratchFile::Append(std::string_view bytes) {
  WriteAt(size_, bytes);
  size_ += static_cast<int64_t>(bytes.size());
  while (size_ - written_back_ >= 2 * kWritebackBytes) WriteBack(size_);
}

void ScratchFile::Overwrite(int64_t offset, std::string_view bytes) {
  if (offset < 0 || static_cast<int64_t>(bytes.size()) > size_ - offset) {
    throw std::out_of_range("scratch file bytes [" + std::to_string(offset) + ", +" +
                            std::to_string(bytes.size()) + ") of " + std::to_string(size_));
  }
  WriteAt(offset, bytes);
}

void ScratchFile::WriteAt(int64_t offset, std::string_view bytes) {
  if (mapped_) throw std::logic_error("ScratchFile: writing after Map");
  while (!bytes.empty()) {
    const ssize_t n = pwrite(fd_, bytes.data(), bytes.size(), offset);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      throw std::runtime_error("cannot write a scratch file in " + Shown(directory_) + " at " +
                               std::to_string(offset) + " bytes: " + ErrorText());
    }
    bytes.remove_prefix(static_cast<size_t>(n));
    offset += n;
  }
}

// Steps 1 and 2 (the header) for a file now `end` bytes long: [written_back_, +block) is the
// block before the one that just filled. Best effort: failures here only cost memory.
void ScratchFile::WriteBack(int64_t end) {
  const int64_t previous = written_back_;
  const int64_t filled = previous + kWritebackBytes;
  sync_file_range(fd_, filled, end - filled, SYNC_FILE_RANGE_WRITE);  // step 1
  sync_file_range(fd_, previous, kWritebackBytes,                     // step 2
                  SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER);
  posix_fadvise(fd_, previous, kWritebackBytes, POSIX_FADV_DONTNEED);
  written_back_ = filled;
}

CheckpointBytes ScratchFile::Map() {
  mapped_ = true;
  std::shared_ptr<CheckpointBytes::Storage> storage =
      MapDescriptor(fd_, static_cast<size_t>(size_), "a scratch file in " + Shown(directory_));
  const std::string_view view(static_cast<const char*>(storage->mapping), storage->mapped_size);
  return CheckpointBytes(std::move(storage), view);
}

}  // namespace gradhub::trainer
