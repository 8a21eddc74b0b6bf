// PackDirectory, in three steps:
//   1. list the tree (lstat, links never followed), skipping what .gradhubignore excludes and
//      refusing what the store would refuse, naming the path;
//   2. measure the archive it makes (the format is deterministic, so its size is known before
//      a byte is written) and refuse a tree over a limit at once;
//   3. write it in sorted path order through one large buffer: file bytes are read straight
//      into it, and it goes out in large writes.
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "services/common/code_archive/code_archive.h"
#include "services/common/code_archive/entry_rules.h"
#include "services/common/code_archive/gradhub_ignore.h"
#include "services/common/code_archive/names.h"
#include "services/common/code_archive/tar_format.h"
#include "services/common/status_macros.h"

namespace gradhub::code {
namespace {

constexpr size_t kWriteBufferBytes = size_t{4} << 20;
constexpr int64_t kEndMarkerBytes = 2 * tar::kBlockBytes;

// One path of the tree to pack, relative to the directory.
struct TreeEntry {
  std::string path;
  EntryKind kind = EntryKind::kFile;
  int64_t size = 0;
  bool executable = false;
  std::string link_target;
};

absl::Status PathError(absl::string_view path, absl::string_view reason) {
  return absl::InvalidArgumentError(absl::StrCat("code ", Quoted(path), ": ", reason));
}

absl::Status PathErrno(int error, absl::string_view what, absl::string_view path) {
  return absl::ErrnoToStatus(error, absl::StrCat("code ", Quoted(path), ": ", what));
}

tar::EntryToWrite ToWrite(const TreeEntry& entry) {
  tar::EntryToWrite out;
  out.path = entry.path;
  out.size = entry.kind == EntryKind::kFile ? entry.size : 0;
  out.link_target = entry.link_target;
  switch (entry.kind) {
    case EntryKind::kDirectory:
      out.type = tar::kDirectory, out.mode = 0755;
      break;
    case EntryKind::kSymlink:
      out.type = tar::kSymlink, out.mode = 0777;
      break;
    case EntryKind::kFile:
      out.type = tar::kRegular, out.mode = entry.executable ? 0755 : 0644;
      break;
  }
  return out;
}

const char* UnpackableKind(mode_t mode) {
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  return "a file of unknown type";
}

// Step 1: the tree under `root`, entries in the order readdir gives them.
class TreeLister {
 public:
  TreeLister(std::string root, const IgnoreRules& ignore, const struct stat& archive)
      : root_(std::move(root)), ignore_(ignore), archive_(archive) {}

  // Appends what `folder` (relative; "" for the root) holds, folders descended.
  absl::Status List(const std::string& folder, std::vector<TreeEntry>* out) const {
    GRADHUB_ASSIGN_OR_RETURN(const std::vector<std::string> names, NamesIn(folder));
    for (const std::string& name : names) {
      const std::string path = folder.empty() ? name : absl::StrCat(folder, "/", name);
      struct stat st;
      if (lstat(absl::StrCat(root_, "/", path).c_str(), &st) != 0) {
        return PathErrno(errno, "lstat", path);
      }
      if (ignore_.Excludes(path, S_ISDIR(st.st_mode))) continue;
      GRADHUB_ASSIGN_OR_RETURN(TreeEntry entry, Describe(path, st));
      out->push_back(std::move(entry));
      if (S_ISDIR(st.st_mode)) GRADHUB_RETURN_IF_ERROR(List(path, out));
    }
    return absl::OkStatus();
  }

 private:
  absl::StatusOr<std::vector<std::string>> NamesIn(const std::string& folder) const {
    DIR* dir = opendir(absl::StrCat(root_, "/", folder).c_str());
    if (dir == nullptr) return PathErrno(errno, "opendir", folder.empty() ? "." : folder);
    std::vector<std::string> names;
    while (const struct dirent* item = readdir(dir)) {
      const absl::string_view name = item->d_name;
      if (name != "." && name != "..") names.emplace_back(name);
    }
    closedir(dir);
    return names;
  }

  // The entry at `path`, or why it cannot be packed.
  absl::StatusOr<TreeEntry> Describe(const std::string& path, const struct stat& st) const {
    if (st.st_dev == archive_.st_dev && st.st_ino == archive_.st_ino) {
      return PathError(path, "is the archive being written; write it outside the directory");
    }
    const absl::StatusOr<std::vector<std::string>> components = SplitName(path);
    if (!components.ok()) return PathError(path, components.status().message());
    TreeEntry entry;
    entry.path = path;
    if (S_ISDIR(st.st_mode)) {
      entry.kind = EntryKind::kDirectory;
    } else if (S_ISREG(st.st_mode)) {
      entry.kind = EntryKind::kFile;
      entry.size = st.st_size;
      entry.executable = (st.st_mode & 0111) != 0;
    } else if (S_ISLNK(st.st_mode)) {
      entry.kind = EntryKind::kSymlink;
      GRADHUB_ASSIGN_OR_RETURN(entry.link_target, LinkTarget(path, st));
      const absl::Status inside = CheckLinkTarget(entry.link_target, components->size() - 1);
      if (!inside.ok()) return PathError(path, inside.message());
    } else {
      return PathError(path, absl::StrCat(UnpackableKind(st.st_mode),
                                          "; only regular files, directories and symbolic "
                                          "links can be packed"));
    }
    return entry;
  }

  absl::StatusOr<std::string> LinkTarget(const std::string& path, const struct stat& st) const {
    std::string target(static_cast<size_t>(std::max<off_t>(st.st_size, 1)) + 1, '\0');
    const ssize_t n =
        readlink(absl::StrCat(root_, "/", path).c_str(), target.data(), target.size());
    if (n < 0) return PathErrno(errno, "readlink", path);
    if (static_cast<size_t>(n) >= target.size()) return PathError(path, "changed while packing");
    target.resize(static_cast<size_t>(n));
    return target;
  }

  const std::string root_;
  const IgnoreRules& ignore_;
  const struct stat archive_;  // never packed into itself
};

// Step 2.
absl::StatusOr<ArchiveSummary> Measure(const std::vector<TreeEntry>& entries,
                                       const ArchiveLimits& limits) {
  ArchiveSummary summary;
  summary.archive_bytes = kEndMarkerBytes;
  for (const TreeEntry& entry : entries) {
    summary.archive_bytes += tar::HeaderBytesOf(ToWrite(entry));
    if (entry.kind != EntryKind::kFile) continue;
    summary.archive_bytes += entry.size + tar::PaddingOf(entry.size);
    summary.unpacked_bytes += entry.size;
  }
  summary.entries = static_cast<int32_t>(entries.size());
  if (entries.size() > static_cast<size_t>(limits.max_entries)) {
    return absl::InvalidArgumentError(
        absl::StrCat("code: ", EntriesOverLimit(entries.size(), limits.max_entries)));
  }
  if (summary.unpacked_bytes > limits.max_unpacked_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "code: ", UnpackedBytesOverLimit(summary.unpacked_bytes, limits.max_unpacked_bytes)));
  }
  if (summary.archive_bytes > limits.max_archive_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "code: ", ArchiveBytesOverLimit(summary.archive_bytes, limits.max_archive_bytes)));
  }
  return summary;
}

// Step 3: the archive's bytes through one buffer to `sink`. Not thread-safe.
class ArchiveWriter {
 public:
  ArchiveWriter(const ArchiveSink& sink, std::string root) : sink_(sink), root_(std::move(root)) {
    buffer_.resize(kWriteBufferBytes);
  }

  absl::Status Write(const std::vector<TreeEntry>& entries) {
    std::string header;
    for (const TreeEntry& entry : entries) {
      header.clear();
      tar::AppendHeader(ToWrite(entry), &header);
      GRADHUB_RETURN_IF_ERROR(Append(header));
      if (entry.kind != EntryKind::kFile) continue;
      GRADHUB_RETURN_IF_ERROR(CopyFile(entry));
      GRADHUB_RETURN_IF_ERROR(Append(std::string(tar::PaddingOf(entry.size), '\0')));
    }
    GRADHUB_RETURN_IF_ERROR(Append(std::string(kEndMarkerBytes, '\0')));
    return Flush();
  }

 private:
  absl::Status Append(absl::string_view bytes) {
    while (!bytes.empty()) {
      if (used_ == buffer_.size()) GRADHUB_RETURN_IF_ERROR(Flush());
      const size_t take = std::min(bytes.size(), buffer_.size() - used_);
      std::copy_n(bytes.data(), take, buffer_.data() + used_);
      used_ += take;
      bytes.remove_prefix(take);
    }
    return absl::OkStatus();
  }

  // The file's `size` bytes, read straight into the buffer; a file that is shorter or longer
  // now than when it was listed is an error (the archive was measured with its old size).
  absl::Status CopyFile(const TreeEntry& entry) {
    const int in =
        open(absl::StrCat(root_, "/", entry.path).c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (in < 0) return PathErrno(errno, "open", entry.path);
    absl::Status status = CopyBytes(in, entry);
    char extra = 0;
    if (status.ok() && read(in, &extra, 1) != 0) {
      status = PathError(entry.path, "grew while packing");
    }
    close(in);
    return status;
  }

  absl::Status CopyBytes(int in, const TreeEntry& entry) {
    for (int64_t left = entry.size; left > 0;) {
      if (used_ == buffer_.size()) GRADHUB_RETURN_IF_ERROR(Flush());
      const size_t room = std::min<int64_t>(left, buffer_.size() - used_);
      const ssize_t n = read(in, buffer_.data() + used_, room);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return PathErrno(errno, "read", entry.path);
      if (n == 0) return PathError(entry.path, "shrank while packing");
      used_ += static_cast<size_t>(n);
      left -= n;
    }
    return absl::OkStatus();
  }

  absl::Status Flush() {
    if (used_ == 0) return absl::OkStatus();
    absl::Status written = sink_(std::string_view(buffer_.data(), used_));
    used_ = 0;
    return written;
  }

  const ArchiveSink& sink_;
  const std::string root_;
  std::vector<char> buffer_;
  size_t used_ = 0;
};

// `archive`: the file being written, never packed into itself (zeros: none).
absl::StatusOr<ArchiveSummary> PackInto(const std::string& dir, const ArchiveSink& sink,
                                        const struct stat& archive, const ArchiveLimits& limits) {
  absl::StatusOr<IgnoreRules> ignore = IgnoreRules::Load(dir);
  if (!ignore.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("code: ", ignore.status().message()));
  }
  std::vector<TreeEntry> entries;
  GRADHUB_RETURN_IF_ERROR(TreeLister(dir, *ignore, archive).List("", &entries));
  std::sort(entries.begin(), entries.end(),
            [](const TreeEntry& a, const TreeEntry& b) { return a.path < b.path; });
  GRADHUB_ASSIGN_OR_RETURN(const ArchiveSummary summary, Measure(entries, limits));
  GRADHUB_RETURN_IF_ERROR(ArchiveWriter(sink, dir).Write(entries));
  return summary;
}

absl::Status CheckIsDirectory(const std::string& dir) {
  struct stat st;
  if (stat(dir.c_str(), &st) != 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("code: directory ", Quoted(dir)));
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat("code: ", Quoted(dir), " is not a directory"));
  }
  return absl::OkStatus();
}

absl::Status WriteAll(int fd, std::string_view bytes) {
  for (size_t done = 0; done < bytes.size();) {
    const ssize_t n = write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return absl::ErrnoToStatus(errno, "code: writing the archive");
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ArchiveSummary> PackDirectoryTo(const std::string& dir, const ArchiveSink& sink,
                                               const ArchiveLimits& limits) {
  GRADHUB_RETURN_IF_ERROR(CheckIsDirectory(dir));
  struct stat none {};
  return PackInto(dir, sink, none, limits);
}

absl::StatusOr<ArchiveSummary> PackDirectory(const std::string& dir,
                                             const std::string& archive_path,
                                             const ArchiveLimits& limits) {
  GRADHUB_RETURN_IF_ERROR(CheckIsDirectory(dir));
  const int fd = open(archive_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return absl::ErrnoToStatus(errno, absl::StrCat("code: open ", archive_path));
  absl::StatusOr<ArchiveSummary> summary;
  struct stat archive;
  if (fstat(fd, &archive) != 0) {
    summary = absl::ErrnoToStatus(errno, "code: fstat the archive");
  } else {
    summary = PackInto(
        dir, [fd](std::string_view bytes) { return WriteAll(fd, bytes); }, archive, limits);
  }
  if (close(fd) != 0 && summary.ok()) {
    summary = absl::ErrnoToStatus(errno, absl::StrCat("code: close ", archive_path));
  }
  if (!summary.ok()) unlink(archive_path.c_str());
  return summary;
}

}  // namespace gradhub::code
