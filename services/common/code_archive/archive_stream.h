// ArchiveStream: a tar's bytes through TarReader and EntryRules, with the archive's own size
// limit: the check behind ArchiveChecker, and behind UnpackArchive with the unpacker as the
// next stage. Every entry is named in its errors (`archive entry "<name>": ...`); the first
// error is kept and returned by every later call. Not thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "services/common/code_archive/code_archive.h"
#include "services/common/code_archive/entry_rules.h"
#include "services/common/code_archive/tar_reader.h"

namespace gradhub::code {

// What receives the entries once they passed the rules: OnEntry, OnData (files only, `size`
// bytes in all), OnEntryEnd. The root directory's entry ("./") is not passed on.
class CheckedEntrySink {
 public:
  virtual ~CheckedEntrySink() = default;
  virtual absl::Status OnEntry(const CheckedEntry& entry) = 0;
  virtual absl::Status OnData(absl::string_view bytes) = 0;
  virtual absl::Status OnEntryEnd() = 0;
};

class ArchiveStream : private TarEntrySink {
 public:
  // `next` may be null: a check only.
  explicit ArchiveStream(const ArchiveLimits& limits, CheckedEntrySink* next = nullptr)
      : limits_(limits), rules_(limits), reader_(this), next_(next) {}
  ArchiveStream(const ArchiveStream&) = delete;
  ArchiveStream& operator=(const ArchiveStream&) = delete;

  absl::Status Feed(absl::string_view bytes);
  absl::StatusOr<ArchiveSummary> Finish();

 private:
  absl::Status OnEntry(const TarEntry& entry) override;
  absl::Status OnData(absl::string_view bytes) override;
  absl::Status OnEntryEnd() override;

  const ArchiveLimits limits_;
  EntryRules rules_;
  TarReader reader_;
  CheckedEntrySink* const next_;
  bool passing_on_ = false;  // the current entry goes to next_
  int64_t archive_bytes_ = 0;
  absl::Status error_;
};

// Feeds the whole file at `path` to `stream` in large reads, then Finish. NOT_FOUND if missing.
absl::StatusOr<ArchiveSummary> StreamFile(const std::string& path, ArchiveStream* stream);

}  // namespace gradhub::code
