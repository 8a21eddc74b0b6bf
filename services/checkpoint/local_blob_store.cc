#include "services/checkpoint/local_blob_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "services/common/status_macros.h"

namespace gradhub::checkpoint {
namespace {

namespace fs = std::filesystem;

constexpr char kUploadSuffix[] = ".part";
// Direct I/O wants buffers, offsets and lengths aligned to the device's logical block; 4096
// covers 512-byte and 4K devices alike.
constexpr size_t kDirectAlignment = 4096;

absl::Status Errno(const std::string& what, const std::string& path) {
  return absl::ErrnoToStatus(errno, absl::StrCat(what, " ", path));
}

// Closes on destruction; -1 = nothing open.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  Fd(Fd&& other) noexcept : fd_(other.release()) {}
  Fd& operator=(Fd&& other) noexcept {
    if (this != &other) {
      if (fd_ >= 0) close(fd_);
      fd_ = other.release();
    }
    return *this;
  }
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

absl::Status FsyncPath(const std::string& path) {
  Fd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return Errno("open", path);
  if (fsync(fd.get()) != 0) return Errno("fsync", path);
  return absl::OkStatus();
}

// mkdir -p of `dir` below `root`, fsyncing the parent of every directory it creates so the
// new entries survive a crash.
absl::Status MakeDirs(const fs::path& root, const fs::path& dir) {
  if (dir == root || !dir.has_parent_path()) return absl::OkStatus();
  struct stat st;
  if (stat(dir.c_str(), &st) == 0) return absl::OkStatus();
  GRADHUB_RETURN_IF_ERROR(MakeDirs(root, dir.parent_path()));
  if (mkdir(dir.c_str(), 0750) != 0 && errno != EEXIST) return Errno("mkdir", dir.string());
  return FsyncPath(dir.parent_path().string());
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

// A page-aligned staging buffer per thread for direct writes, kept between appends: a fresh
// megabyte per chunk would cost page faults on every chunk.
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

// Appends `data` at `held` (the file's size) through an O_DIRECT descriptor:
//   1. the staging buffer starts at the block boundary at or below `held`, with the bytes of
//      that partial block read back from the file (only after an append that ended mid-block);
//   2. the whole blocks go out with O_DIRECT, straight to the device;
//   3. the tail shorter than a block is written through the page cache (O_DIRECT switched off
//      on the descriptor), so the file never holds padding and its size stays the bytes held.
// A short direct write or a device that refuses an aligned one finishes the append buffered.
absl::Status AppendDirect(int fd, std::string_view data, int64_t held, const std::string& path) {
  thread_local AlignedBuffer staging;
  const int64_t start = held / kDirectAlignment * kDirectAlignment;
  const size_t head = static_cast<size_t>(held - start);
  const size_t total = head + data.size();
  char* buffer = staging.Reserve(total + kDirectAlignment);
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
  if (flags < 0 || fcntl(fd, F_SETFL, flags & ~O_DIRECT) != 0) return Errno("fcntl", path);
  return WriteAll(fd, std::string_view(buffer + written, total - written),
                  start + static_cast<int64_t>(written), path);
}

class LocalBlobReader final : public BlobReader {
 public:
  LocalBlobReader(int fd, int64_t size, std::string path)
      : fd_(fd), size_(size), path_(std::move(path)) {}

  absl::Status Read(size_t max_bytes, std::string* out) override {
    out->resize(max_bytes);
    size_t filled = 0;
    while (filled < max_bytes) {
      const ssize_t n = read(fd_.get(), out->data() + filled, max_bytes - filled);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return Errno("read", path_);
      if (n == 0) break;
      filled += static_cast<size_t>(n);
    }
    out->resize(filled);
    return absl::OkStatus();
  }
  int64_t size() const override { return size_; }

 private:
  Fd fd_;
  const int64_t size_;
  const std::string path_;
};

}  // namespace

absl::Status CheckBlobKey(std::string_view key, bool is_blob) {
  auto bad = [&] {
    return absl::InvalidArgumentError(
        absl::StrCat(is_blob ? "blob" : "upload", " key '", std::string(key), "' is not valid"));
  };
  if (key.empty() || key.size() > 512) return bad();
  size_t segment_start = 0;
  for (size_t i = 0; i <= key.size(); ++i) {
    if (i == key.size() || key[i] == '/') {
      const std::string_view segment = key.substr(segment_start, i - segment_start);
      if (segment.empty() || segment == "." || segment == "..") return bad();
      if (i < key.size() && !is_blob) return bad();
      segment_start = i + 1;
      continue;
    }
    const char c = key[i];
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-';
    if (!ok) return bad();
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<LocalBlobStore>> LocalBlobStore::Open(const std::string& data_dir,
                                                                     Options options) {
  if (data_dir.empty()) return absl::InvalidArgumentError("data directory: empty");
  std::error_code error;
  for (const char* sub : {"uploads", "blobs"}) {
    fs::create_directories(fs::path(data_dir) / sub, error);
    if (error) {
      return absl::UnavailableError(absl::StrCat(
          "cannot create ", (fs::path(data_dir) / sub).string(), ": ", error.message()));
    }
  }
  return std::unique_ptr<LocalBlobStore>(new LocalBlobStore(data_dir, options));
}

std::string LocalBlobStore::UploadPath(const std::string& upload) const {
  return absl::StrCat(data_dir_, "/uploads/", upload, kUploadSuffix);
}

std::string LocalBlobStore::BlobPath(const std::string& blob) const {
  return absl::StrCat(data_dir_, "/blobs/", blob);
}

absl::StatusOr<int64_t> LocalBlobStore::Append(const std::string& upload, int64_t offset,
                                               std::string_view data) {
  GRADHUB_RETURN_IF_ERROR(CheckBlobKey(upload, false));
  if (offset < 0) return absl::InvalidArgumentError("offset: must not be negative");
  const std::string path = UploadPath(upload);
  const int create = offset == 0 ? O_CREAT : 0;
  // Read and write: a direct append that starts mid-block reads that block back first.
  bool direct = options_.direct_io;
  Fd fd(open(path.c_str(), O_RDWR | O_CLOEXEC | (direct ? O_DIRECT : 0) | create, 0640));
  if (fd.get() < 0 && errno == EINVAL && direct) {  // a filesystem without O_DIRECT
    direct = false;
    fd = Fd(open(path.c_str(), O_RDWR | O_CLOEXEC | create, 0640));
  }
  if (fd.get() < 0 && errno == ENOENT) {
    return absl::OutOfRangeError(absl::StrCat("offset ", offset, " is beyond the 0 bytes held"));
  }
  if (fd.get() < 0) return Errno("open", path);
  struct stat st;
  if (fstat(fd.get(), &st) != 0) return Errno("stat", path);
  const int64_t held = st.st_size;
  if (offset > held) {
    return absl::OutOfRangeError(
        absl::StrCat("offset ", offset, " is beyond the ", held, " bytes held"));
  }
  const int64_t skip = held - offset;
  if (skip >= static_cast<int64_t>(data.size())) return held;  // all of it arrived before
  data.remove_prefix(static_cast<size_t>(skip));
  const int64_t end = held + static_cast<int64_t>(data.size());
  if (direct) {
    GRADHUB_RETURN_IF_ERROR(AppendDirect(fd.get(), data, held, path));
    return end;
  }
  GRADHUB_RETURN_IF_ERROR(WriteAll(fd.get(), data, held, path));
  // Starts writeback of every whole kWritebackBytes window this append completed.
  const int64_t from = held / kWritebackBytes * kWritebackBytes;
  const int64_t to = end / kWritebackBytes * kWritebackBytes;
  if (to > from) sync_file_range(fd.get(), from, to - from, SYNC_FILE_RANGE_WRITE);
  return end;
}

absl::StatusOr<int64_t> LocalBlobStore::UploadedBytes(const std::string& upload) {
  GRADHUB_RETURN_IF_ERROR(CheckBlobKey(upload, false));
  struct stat st;
  const std::string path = UploadPath(upload);
  if (stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return 0;
    return Errno("stat", path);
  }
  return static_cast<int64_t>(st.st_size);
}

absl::Status LocalBlobStore::Commit(const std::string& upload, const std::string& blob) {
  GRADHUB_RETURN_IF_ERROR(CheckBlobKey(upload, false));
  GRADHUB_RETURN_IF_ERROR(CheckBlobKey(blob, true));
  const std::string from = UploadPath(upload), to = BlobPath(blob);
  {
    // 1. The upload's data and size on disk.
    Fd fd(open(from.c_str(), O_WRONLY | O_CLOEXEC));
    if (fd.get() < 0 && errno == ENOENT) {
      struct stat st;
      if (stat(to.c_str(), &st) == 0) return absl::OkStatus();  // committed before
      return absl::NotFoundError(absl::StrCat("upload '", upload, "' not found"));
    }
    if (fd.get() < 0) return Errno("open", from);
    if (fsync(fd.get()) != 0) return Errno("fsync", from);
  }
  const fs::path target(to), root = fs::path(data_dir_) / "blobs";
  // A Delete may remove the blob's directory once empty, between 2. and 3.: try again then.
  for (int tries = 0;; ++tries) {
    GRADHUB_RETURN_IF_ERROR(MakeDirs(root, target.parent_path()));  // 2.
    if (rename(from.c_str(), to.c_str()) == 0) break;               // 3.
    if (errno != ENOENT || tries == 2) return Errno("rename to", to);
  }
  return FsyncPath(target.parent_path().string());  // 4.
}

absl::Status LocalBlobStore::Abort(const std::string& upload) {
  GRADHUB_RETURN_IF_ERROR(CheckBlobKey(upload, false));
  const std::string path = UploadPath(upload);
  if (unlink(path.c_str()) != 0 && errno != ENOENT) return Errno("unlink", path);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<BlobReader>> LocalBlobStore::Open(const std::string& blob,
                                                                 int64_t offset) {
  GRADHUB_RETURN_IF_ERROR(CheckBlobKey(blob, true));
  const std::string path = BlobPath(blob);
  Fd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0 && errno == ENOENT) {
    return absl::NotFoundError(absl::StrCat("blob '", blob, "' not found"));
  }
  if (fd.get() < 0) return Errno("open", path);
  struct stat st;
  if (fstat(fd.get(), &st) != 0) return Errno("stat", path);
  if (offset < 0 || offset > st.st_size) {
    return absl::OutOfRangeError(
        absl::StrCat("offset ", offset, " is outside the blob's ", st.st_size, " bytes"));
  }
  if (lseek(fd.get(), offset, SEEK_SET) < 0) return Errno("seek", path);
  posix_fadvise(fd.get(), offset, 0, POSIX_FADV_SEQUENTIAL);
  return std::make_unique<LocalBlobReader>(fd.release(), st.st_size, path);
}

absl::StatusOr<int64_t> LocalBlobStore::BlobSize(const std::string& blob) {
  GRADHUB_RETURN_IF_ERROR(CheckBlobKey(blob, true));
  struct stat st;
  const std::string path = BlobPath(blob);
  if (stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat("blob '", blob, "' not found"));
    return Errno("stat", path);
  }
  return static_cast<int64_t>(st.st_size);
}

absl::Status LocalBlobStore::Delete(const std::string& blob) {
  GRADHUB_RETURN_IF_ERROR(CheckBlobKey(blob, true));
  const std::string path = BlobPath(blob);
  if (unlink(path.c_str()) != 0 && errno != ENOENT) return Errno("unlink", path);
  // The job's directory goes with its last blob (fails harmlessly while others remain).
  const fs::path dir = fs::path(path).parent_path();
  if (dir != fs::path(data_dir_) / "blobs") rmdir(dir.c_str());
  return absl::OkStatus();
}

absl::StatusOr<std::vector<UploadInfo>> LocalBlobStore::ListUploads() {
  std::vector<UploadInfo> uploads;
  std::error_code error;
  for (const fs::directory_entry& entry :
       fs::directory_iterator(fs::path(data_dir_) / "uploads", error)) {
    const std::string name = entry.path().filename().string();
    if (!absl::EndsWith(name, kUploadSuffix)) continue;
    struct stat st;
    if (stat(entry.path().c_str(), &st) != 0) continue;  // removed meanwhile
    uploads.push_back({name.substr(0, name.size() - sizeof(kUploadSuffix) + 1),
                       static_cast<int64_t>(st.st_size), absl::TimeFromTimespec(st.st_mtim)});
  }
  if (error) return absl::UnavailableError(absl::StrCat("list uploads: ", error.message()));
  return uploads;
}

absl::StatusOr<std::vector<BlobInfo>> LocalBlobStore::ListBlobs() {
  std::vector<BlobInfo> blobs;
  const fs::path root = fs::path(data_dir_) / "blobs";
  std::error_code error;
  for (auto it = fs::recursive_directory_iterator(root, error);
       !error && it != fs::recursive_directory_iterator(); it.increment(error)) {
    if (!it->is_regular_file(error)) continue;
    struct stat st;
    if (stat(it->path().c_str(), &st) != 0) continue;
    blobs.push_back({fs::relative(it->path(), root).string(), static_cast<int64_t>(st.st_size)});
  }
  if (error) return absl::UnavailableError(absl::StrCat("list blobs: ", error.message()));
  return blobs;
}

}  // namespace gradhub::checkpoint
