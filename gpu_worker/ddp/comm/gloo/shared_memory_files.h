// Files on a tmpfs that the processes of one host map together: the shared-memory allreduce's
// segments and the shared-memory buffers' regions.
#pragma once

#include <cstddef>
#include <string>

namespace gradhub::ddp::detail {

// Creates "<directory>/gradhub-<random 64-bit hex>" (O_EXCL, O_NOFOLLOW, mode 0600), sizes it
// with posix_fallocate (with ftruncate alone a full tmpfs -- Docker's /dev/shm is 64 MiB -- is
// found only by SIGBUS at first touch) and maps it. Returns the mapping, or null with `failure`
// set. `path` names the file whenever it was created, so the caller unlinks it on every path.
void* CreateSharedFile(const std::string& directory, size_t bytes, std::string& path,
                       std::string& failure);

// Opens and maps `path`, which must have exactly `bytes`; null with `failure` set otherwise.
void* OpenSharedFile(const std::string& path, size_t bytes, std::string& failure);

// strerror's text for `error`, thread-safe.
std::string ErrorText(int error);

}  // namespace gradhub::ddp::detail
