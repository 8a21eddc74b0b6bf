#include "services/common/code_archive/archive_stream.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "absl/strings/str_cat.h"
#include "services/common/code_archive/names.h"
#include "services/common/status_macros.h"

namespace gradhub::code {
namespace {

constexpr size_t kReadBytes = size_t{1} << 20;
constexpr size_t kMinReadBytes = 4096;

}  // namespace

absl::Status ArchiveStream::Feed(absl::string_view bytes) {
  if (!error_.ok()) return error_;
  // Up to the limit, then the error names the entry at the byte past it: the same entry
  // whatever the split of the bytes.
  const int64_t room = limits_.max_archive_bytes - archive_bytes_;
  const bool over = static_cast<int64_t>(bytes.size()) > room;
  if (over) bytes = bytes.substr(0, static_cast<size_t>(room));
  archive_bytes_ += static_cast<int64_t>(bytes.size());
  error_ = reader_.Feed(bytes);
  if (error_.ok() && over) {
    const std::string reason = ArchiveOverLimit(limits_.max_archive_bytes);
    const std::string& name = reader_.current_name();
    error_ = name.empty() ? absl::InvalidArgumentError(absl::StrCat("archive: ", reason))
                          : EntryError(name, reason);
  }
  return error_;
}

absl::StatusOr<ArchiveSummary> ArchiveStream::Finish() {
  if (error_.ok()) error_ = reader_.Finish();
  if (!error_.ok()) return error_;
  return ArchiveSummary{archive_bytes_, rules_.unpacked_bytes(), rules_.entries()};
}

absl::Status ArchiveStream::OnEntry(const TarEntry& entry) {
  GRADHUB_ASSIGN_OR_RETURN(const CheckedEntry checked, rules_.Check(entry));
  passing_on_ = next_ != nullptr && !checked.components.empty();
  if (!passing_on_) return absl::OkStatus();
  const absl::Status passed = next_->OnEntry(checked);
  return passed.ok() ? passed : WithEntryName(entry.name, passed);
}

absl::Status ArchiveStream::OnData(absl::string_view bytes) {
  if (!passing_on_) return absl::OkStatus();
  const absl::Status passed = next_->OnData(bytes);
  return passed.ok() ? passed : WithEntryName(reader_.current_name(), passed);
}

absl::Status ArchiveStream::OnEntryEnd() {
  if (!passing_on_) return absl::OkStatus();
  passing_on_ = false;
  const absl::Status passed = next_->OnEntryEnd();
  return passed.ok() ? passed : WithEntryName(reader_.current_name(), passed);
}

absl::StatusOr<ArchiveSummary> StreamFile(const std::string& path, ArchiveStream* stream) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::ErrnoToStatus(errno, absl::StrCat("open ", path));
  // A small archive gets a small buffer: zeroing 1 MiB for each would dominate unpacking it.
  struct stat file {};
  const size_t size = fstat(fd, &file) == 0 ? static_cast<size_t>(file.st_size) : kReadBytes;
  std::string buffer(std::clamp(size, kMinReadBytes, kReadBytes), '\0');
  absl::Status status;
  while (status.ok()) {
    const ssize_t n = read(fd, buffer.data(), buffer.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) status = absl::ErrnoToStatus(errno, absl::StrCat("read ", path));
    if (n <= 0) break;
    status = stream->Feed(absl::string_view(buffer.data(), static_cast<size_t>(n)));
  }
  close(fd);
  if (!status.ok()) return status;
  return stream->Finish();
}

}  // namespace gradhub::code
