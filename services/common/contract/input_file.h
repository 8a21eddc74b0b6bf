// Opening a file a job spec names (a dataset, a TorchScript model) on a node, so that a spec
// reads only what the node's data roots hold, only regular files, and nothing too large.
//
// OpenInputFile, in order; each refusal is a UserError naming the spec field, and no message
// ever carries a byte of any file:
//   1. Under enforcement (the agent always enforces; a trainer run by hand does not), the path
//      as written must be clean and under a data root (data_paths.h): "/data/../etc/shadow"
//      and "/etc/shadow" stop here.
//   2. realpath() resolves symlinks; the result must again lie under a resolved root, so a
//      symlink inside a root that points out of it is refused.
//   3. open(O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC): O_NONBLOCK so a FIFO
//      cannot block the rank, O_NOFOLLOW so a last component swapped for a symlink after step
//      2 fails instead of being followed.
//   4. fstat/fstatfs on the opened descriptor (not the name, which could change under us):
//      only a regular file (no directory, device such as /dev/zero, FIFO or socket), not on a
//      pseudo filesystem (proc, sysfs: /proc/self/environ is a "regular file" of size 0 there),
//      and at most max_bytes.
//   5. /proc/self/fd/N names the file actually opened; it must be under a root too, which
//      closes the window between steps 2 and 3 for a directory component swapped for a
//      symlink.
// Readers must still bound what they read (a file may grow, a gzip file may inflate): see
// ReadAllBounded.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace gradhub {

struct InputPolicy {
  // When false (a trainer started by hand), any path is accepted by steps 1, 2 and 5; steps 3
  // and 4 still apply.
  bool enforce_roots = false;
  // Absolute and clean, as configured: spec paths are compared with these as written (step 1),
  // and resolved paths with their realpath (steps 2 and 5), so a root that is itself a
  // symlink (/data -> /mnt/data) works.
  std::vector<std::string> data_roots;
  // Largest file accepted, and the most bytes read from one (after gzip decompression).
  int64_t max_bytes = int64_t{4} << 30;
};

// The process-wide policy (the trainer sets it once from its flags, before loading data).
// Not thread-safe against concurrent readers: set it before any file is opened.
void SetInputPolicy(InputPolicy policy);
const InputPolicy& CurrentInputPolicy();

// An open regular file; closes on destruction.
class InputFile {
 public:
  InputFile(int fd, int64_t size) : fd_(fd), size_(size) {}
  ~InputFile();
  InputFile(InputFile&& other) noexcept : fd_(other.fd_), size_(other.size_) { other.fd_ = -1; }
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;
  int fd() const { return fd_; }
  int64_t size() const { return size_; }
  // Gives the descriptor away (e.g. to gzdopen).
  int Release();

 private:
  int fd_;
  int64_t size_;
};

// Steps 1-5 above under `policy`. Throws UserError(field, ...).
InputFile OpenInputFile(const std::string& path, const std::string& field,
                        const InputPolicy& policy = CurrentInputPolicy());

// Steps 1, 2 and 4 by name, without opening: what the agent checks before it starts a rank,
// so a bad path fails at once. "" when fine, else the message (naming the field).
std::string CheckInputPath(const std::string& path, const std::string& field,
                           const InputPolicy& policy);

// The whole file, at most policy.max_bytes (more is a UserError naming the field).
std::string ReadAllBounded(InputFile& file, const std::string& field,
                           const InputPolicy& policy = CurrentInputPolicy());

}  // namespace gradhub
