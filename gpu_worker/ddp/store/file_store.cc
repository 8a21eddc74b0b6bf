#include "gpu_worker/ddp/store/file_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "gpu_worker/ddp/store/poller.h"
#include "gpu_worker/ddp/store/store_errors.h"

namespace gradhub::ddp {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;

constexpr char kKeyFilePrefix[] = "k.";
constexpr size_t kKeyFilePrefixSize = sizeof(kKeyFilePrefix) - 1;
constexpr char kLockFileName[] = ".lock";
// Only one writer runs at a time (it holds the lock), so one temp name is enough, and a
// writer that died leaves at most this one file behind for the next to truncate.
constexpr char kTempFileName[] = ".tmp";

[[noreturn]] void ThrowIo(const std::string& what, const std::string& path, int error) {
  throw StoreError("FileStore: cannot " + what + " " + path + ": " + std::strerror(error));
}

// ASCII only, not isalnum(): a locale must not change file names.
bool IsPlain(unsigned char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '_' || c == '-';
}

std::string EncodeKey(const std::string& key) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string name = kKeyFilePrefix;
  for (unsigned char c : key) {
    if (IsPlain(c)) {
      name += static_cast<char>(c);
    } else {
      name += '%';
      name += kHex[c >> 4];
      name += kHex[c & 0xF];
    }
  }
  return name;
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// The key a file name holds, or nullopt for the lock file, temp files and anything else.
std::optional<std::string> DecodeKey(const std::string& name) {
  if (name.compare(0, kKeyFilePrefixSize, kKeyFilePrefix) != 0) return std::nullopt;
  std::string key;
  for (size_t i = kKeyFilePrefixSize; i < name.size(); ++i) {
    if (name[i] != '%') {
      key += name[i];
      continue;
    }
    int high = i + 2 < name.size() ? HexValue(name[i + 1]) : -1;
    int low = high >= 0 ? HexValue(name[i + 2]) : -1;
    if (low < 0) return std::nullopt;
    key += static_cast<char>(high * 16 + low);
    i += 2;
  }
  return key;
}

// Holds an exclusive flock() on the store's lock file for its lifetime. The file is opened
// here, not once per store: flock() belongs to the open file description, which threads of a
// process and a fork()ed child would otherwise share, and then none of them would exclude
// the others.
class FileLock {
 public:
  explicit FileLock(const std::string& path) {
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) ThrowIo("open lock file", path, errno);
    while (::flock(fd_, LOCK_EX) != 0) {
      if (errno == EINTR) continue;
      int error = errno;
      ::close(fd_);
      ThrowIo("lock", path, error);
    }
  }
  ~FileLock() { ::close(fd_); }  // Closing the last descriptor releases the lock.
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  int fd_;
};

}  // namespace

FileStore::FileStore(std::string dir) : dir_(std::move(dir)) {
  std::error_code error;
  fs::create_directories(dir_, error);
  if (!error && !fs::is_directory(dir_, error) && !error) {
    error = std::make_error_code(std::errc::not_a_directory);
  }
  if (error) ThrowIo("create directory", dir_, error.value());
  // Fail here, not in the first Add, when the directory is not writable.
  FileLock check(dir_ + "/" + kLockFileName);
}

void FileStore::Set(const std::string& key, const std::string& value) {
  FileLock lock(dir_ + "/" + kLockFileName);
  WriteLocked(PathOf(key), value);
}

std::string FileStore::Get(const std::string& key, milliseconds timeout) {
  // Read, not Exists() then Read(): a DeletePrefix in between must not fail the Get.
  Poller poller(timeout);
  while (true) {
    if (auto value = Read(key)) return *std::move(value);
    if (!poller.Sleep()) throw StoreTimeoutError(DescribeTimeout({key}, timeout));
  }
}

int64_t FileStore::Add(const std::string& key, int64_t delta) {
  FileLock lock(dir_ + "/" + kLockFileName);
  int64_t value = ParseCounter(key, Read(key).value_or("0")) + delta;
  WriteLocked(PathOf(key), std::to_string(value));
  return value;
}

void FileStore::Wait(const std::vector<std::string>& keys, milliseconds timeout) {
  Poller poller(timeout);
  while (true) {
    std::vector<std::string> missing;
    for (const auto& key : keys) {
      if (!Exists(key)) missing.push_back(key);
    }
    if (missing.empty()) return;
    if (!poller.Sleep()) throw StoreTimeoutError(DescribeTimeout(missing, timeout));
  }
}

bool FileStore::Check(const std::vector<std::string>& keys) {
  return std::all_of(keys.begin(), keys.end(), [&](const auto& key) { return Exists(key); });
}

int64_t FileStore::DeletePrefix(const std::string& prefix) {
  FileLock lock(dir_ + "/" + kLockFileName);
  // Collect first, then unlink: whether readdir() sees entries changed under it is unspecified.
  std::vector<fs::path> doomed;
  std::error_code error;
  for (fs::directory_iterator it(dir_, error), end; !error && it != end; it.increment(error)) {
    auto key = DecodeKey(it->path().filename().string());
    if (key && key->compare(0, prefix.size(), prefix) == 0) doomed.push_back(it->path());
  }
  if (error) ThrowIo("list directory", dir_, error.value());
  for (const auto& path : doomed) {
    if (::unlink(path.c_str()) != 0) ThrowIo("remove", path.string(), errno);
  }
  return static_cast<int64_t>(doomed.size());
}

std::string FileStore::PathOf(const std::string& key) const { return dir_ + "/" + EncodeKey(key); }

std::optional<std::string> FileStore::Read(const std::string& key) const {
  std::string path = PathOf(key);
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return std::nullopt;
    ThrowIo("open", path, errno);
  }
  // The descriptor keeps this version's inode even if a Set renames a new one over it.
  std::string value;
  char buffer[64 * 1024];
  while (true) {
    ssize_t n = ::read(fd, buffer, sizeof(buffer));
    if (n > 0) {
      value.append(buffer, static_cast<size_t>(n));
    } else if (n == 0) {
      break;
    } else if (errno != EINTR) {
      int error = errno;
      ::close(fd);
      ThrowIo("read", path, error);
    }
  }
  ::close(fd);
  return value;
}

bool FileStore::Exists(const std::string& key) const {
  std::string path = PathOf(key);
  if (::access(path.c_str(), F_OK) == 0) return true;
  if (errno == ENOENT) return false;
  ThrowIo("look up", path, errno);
}

void FileStore::WriteLocked(const std::string& path, const std::string& value) {
  std::string temp = dir_ + "/" + kTempFileName;
  int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) ThrowIo("create", temp, errno);
  const char* data = value.data();
  size_t left = value.size();
  while (left > 0) {
    ssize_t n = ::write(fd, data, left);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int error = errno;
      ::close(fd);
      ::unlink(temp.c_str());
      ThrowIo("write", temp, error);
    }
    data += n;
    left -= static_cast<size_t>(n);
  }
  // No fsync: the store lives as long as one job's rendezvous, not across a machine crash.
  if (::close(fd) != 0) {
    int error = errno;
    ::unlink(temp.c_str());
    ThrowIo("write", temp, error);
  }
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    int error = errno;
    ::unlink(temp.c_str());
    ThrowIo("rename " + temp + " to", path, error);
  }
}

}  // namespace gradhub::ddp
