// UnpackArchive: the archive through ArchiveStream (every rule checked again), with TreeWriter
// as its next stage. TreeWriter never resolves a path as a whole: it walks from dest_dir's
// descriptor one component at a time (O_NOFOLLOW | O_DIRECTORY), so a link in the way fails
// the walk instead of leading out, and it creates with O_EXCL, so nothing existing is reused.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "services/common/code_archive/archive_stream.h"
#include "services/common/code_archive/code_archive.h"
#include "services/common/status_macros.h"

namespace gradhub::code {
namespace {

constexpr mode_t kDirectoryMode = 0755;

absl::Status Errno(absl::string_view what) { return absl::ErrnoToStatus(errno, what); }

// The directory `name` in `parent`, created (0755) if missing; a link or a file there is an
// error (ELOOP, ENOTDIR). The caller closes the descriptor.
absl::StatusOr<int> OpenDirectory(int parent, const std::string& name) {
  if (mkdirat(parent, name.c_str(), kDirectoryMode) != 0 && errno != EEXIST) {
    return Errno(absl::StrCat("mkdir ", name));
  }
  const int fd = openat(parent, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return Errno(absl::StrCat("open directory ", name));
  if (fchmod(fd, kDirectoryMode) != 0) {  // whatever the umask took away
    close(fd);
    return Errno(absl::StrCat("chmod ", name));
  }
  return fd;
}

// Writes checked entries under a root descriptor. Not thread-safe.
class TreeWriter : public CheckedEntrySink {
 public:
  explicit TreeWriter(int root) : root_(root) {}
  ~TreeWriter() override {
    if (file_ >= 0) close(file_);
    if (folder_ >= 0) close(folder_);
  }
  TreeWriter(const TreeWriter&) = delete;
  TreeWriter& operator=(const TreeWriter&) = delete;

  absl::Status OnEntry(const CheckedEntry& entry) override {
    GRADHUB_ASSIGN_OR_RETURN(const int folder, FolderOf(entry.components));
    const std::string& name = entry.components.back();
    switch (entry.kind) {
      case EntryKind::kDirectory: {
        GRADHUB_ASSIGN_OR_RETURN(const int fd, OpenDirectory(folder, name));
        close(fd);
        return absl::OkStatus();
      }
      case EntryKind::kSymlink:
        if (symlinkat(entry.link_target.c_str(), folder, name.c_str()) != 0) {
          return Errno("symlink");
        }
        return absl::OkStatus();
      case EntryKind::kFile:
        file_ = openat(folder, name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                       0600);
        if (file_ < 0) return Errno("create");
        file_mode_ = entry.executable ? 0755 : 0644;
        return absl::OkStatus();
    }
    return absl::InternalError("an entry of no known kind");
  }

  absl::Status OnData(absl::string_view bytes) override {
    while (!bytes.empty()) {
      const ssize_t n = write(file_, bytes.data(), bytes.size());
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return Errno("write");
      bytes.remove_prefix(static_cast<size_t>(n));
    }
    return absl::OkStatus();
  }

  absl::Status OnEntryEnd() override {
    if (file_ < 0) return absl::OkStatus();
    const int fd = std::exchange(file_, -1);
    // Exactly 0644 or 0755: no setuid, setgid or sticky bit, whatever the header said.
    const bool moded = fchmod(fd, file_mode_) == 0;
    const bool closed = close(fd) == 0;
    return moded && closed ? absl::OkStatus() : Errno("chmod and close");
  }

 private:
  // The descriptor of the entry's folder, every component opened without following links.
  // The last folder stays open: archives list a folder's files together.
  absl::StatusOr<int> FolderOf(const std::vector<std::string>& components) {
    if (components.size() == 1) return root_;
    const std::string path = absl::StrJoin(components.begin(), components.end() - 1, "/");
    if (folder_ >= 0 && path == folder_path_) return folder_;
    if (folder_ >= 0) close(std::exchange(folder_, -1));
    int at = root_;
    for (size_t i = 0; i + 1 < components.size(); ++i) {
      absl::StatusOr<int> next = OpenDirectory(at, components[i]);
      if (at != root_) close(at);
      if (!next.ok()) return next.status();
      at = *next;
    }
    folder_ = at;
    folder_path_ = path;
    return folder_;
  }

  const int root_;
  int folder_ = -1;  // FolderOf's last answer, for folder_path_
  std::string folder_path_;
  int file_ = -1;  // the file whose data is being written
  mode_t file_mode_ = 0644;
};

absl::StatusOr<ArchiveSummary> UnpackInto(const std::string& archive_path, int root,
                                          const ArchiveLimits& limits) {
  if (fchmod(root, kDirectoryMode) != 0) return Errno("chmod the destination");
  TreeWriter writer(root);
  ArchiveStream stream(limits, &writer);
  return StreamFile(archive_path, &stream);
}

}  // namespace

absl::StatusOr<ArchiveSummary> UnpackArchive(const std::string& archive_path,
                                             const std::string& dest_dir,
                                             const ArchiveLimits& limits) {
  if (mkdir(dest_dir.c_str(), kDirectoryMode) != 0) {
    return errno == EEXIST
               ? absl::AlreadyExistsError(absl::StrCat("unpack: ", dest_dir, " already exists"))
               : Errno(absl::StrCat("unpack: mkdir ", dest_dir));
  }
  const int root = open(dest_dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  absl::StatusOr<ArchiveSummary> summary = root < 0 ? Errno(absl::StrCat("unpack: open ", dest_dir))
                                                    : UnpackInto(archive_path, root, limits);
  if (root >= 0) close(root);
  if (!summary.ok()) {
    std::error_code ignored;  // the error at hand is the one to report
    std::filesystem::remove_all(dest_dir, ignored);
  }
  return summary;
}

}  // namespace gradhub::code
