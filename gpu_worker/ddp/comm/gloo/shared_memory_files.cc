#include "gpu_worker/ddp/comm/gloo/shared_memory_files.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <random>
#include <sstream>
#include <system_error>

#include "gpu_worker/ddp/comm/checks.h"

namespace gradhub::ddp::detail {
namespace {

std::string RandomHex64() {
  std::random_device random;
  const uint64_t value = (static_cast<uint64_t>(random()) << 32) ^ random();
  std::ostringstream out;
  out << std::hex << value;
  return out.str();
}

// Maps `fd` (closed either way) or returns null with the reason in `failure`.
void* MapFile(int fd, size_t bytes, const std::string& path, std::string& failure) {
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int error = errno;
  close(fd);
  if (base == MAP_FAILED) {
    failure = StrCat("mmap of ", bytes, " bytes of ", path, ": ", ErrorText(error));
    return nullptr;
  }
  return base;
}

}  // namespace

std::string ErrorText(int error) {
  return std::error_code(error, std::generic_category()).message();
}

void* CreateSharedFile(const std::string& directory, size_t bytes, std::string& path,
                       std::string& failure) {
  const std::string name = directory + "/gradhub-" + RandomHex64();
  const int fd = open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) {
    failure = StrCat("creating ", name, ": ", ErrorText(errno));
    return nullptr;
  }
  path = name;
  if (const int error = posix_fallocate(fd, 0, static_cast<off_t>(bytes)); error != 0) {
    close(fd);
    failure = StrCat("allocating ", bytes, " bytes for ", name, ": ", ErrorText(error));
    return nullptr;
  }
  return MapFile(fd, bytes, name, failure);
}

void* OpenSharedFile(const std::string& path, size_t bytes, std::string& failure) {
  const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    failure = StrCat("opening ", path, ": ", ErrorText(errno));
    return nullptr;
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) != bytes) {
    close(fd);
    failure = StrCat(path, " has ", st.st_size, " bytes, expected ", bytes);
    return nullptr;
  }
  return MapFile(fd, bytes, path, failure);
}

}  // namespace gradhub::ddp::detail
