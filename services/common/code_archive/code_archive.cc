#include "services/common/code_archive/code_archive.h"

#include "services/common/code_archive/archive_stream.h"

namespace gradhub::code {

class ArchiveChecker::State : public ArchiveStream {
 public:
  using ArchiveStream::ArchiveStream;
};

ArchiveChecker::ArchiveChecker(ArchiveLimits limits) : state_(std::make_unique<State>(limits)) {}
ArchiveChecker::~ArchiveChecker() = default;
ArchiveChecker::ArchiveChecker(ArchiveChecker&&) noexcept = default;
ArchiveChecker& ArchiveChecker::operator=(ArchiveChecker&&) noexcept = default;

absl::Status ArchiveChecker::Feed(std::string_view bytes) {
  return state_->Feed(absl::string_view(bytes.data(), bytes.size()));
}

absl::StatusOr<ArchiveSummary> ArchiveChecker::Finish() { return state_->Finish(); }

absl::StatusOr<ArchiveSummary> CheckArchiveFile(const std::string& archive_path,
                                                const ArchiveLimits& limits) {
  ArchiveStream stream(limits);
  return StreamFile(archive_path, &stream);
}

}  // namespace gradhub::code
