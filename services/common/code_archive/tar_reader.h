// TarReader: a tar archive's entries out of its bytes as they stream in, in any split.
//
// For each entry it calls the sink, in order: OnEntry (the header, with pax 'x' records and GNU
// long names applied), OnData for its data (`size` bytes in all, in pieces of any size; only
// ever for regular files, since the rules give other types no data), OnEntryEnd. Metadata
// headers ('x', 'g', 'L', 'K') are consumed here and never reach the sink; 'g' is skipped.
//
// The stream, block by block:
//   1. a header block; its checksum must match;
//   2. its data, padded to a whole block;
//   3. a zero block, which must be followed by a second one: the end marker. After it every
//      byte is ignored.
// An error from a block or from the sink is kept: every later Feed and Finish return it.
// Not thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "services/common/code_archive/tar_format.h"

namespace gradhub::code {

// One entry as the archive describes it, before any rule is applied.
struct TarEntry {
  std::string name;
  char type = tar::kRegular;
  std::string link_target;
  int64_t size = 0;
  uint32_t mode = 0;
};

class TarEntrySink {
 public:
  virtual ~TarEntrySink() = default;
  virtual absl::Status OnEntry(const TarEntry& entry) = 0;
  virtual absl::Status OnData(absl::string_view bytes) = 0;
  virtual absl::Status OnEntryEnd() = 0;
};

class TarReader {
 public:
  // Metadata headers ('x', 'L', 'K', 'g') above this size are refused: names are far shorter.
  static constexpr int64_t kMaxMetadataBytes = int64_t{1} << 20;

  explicit TarReader(TarEntrySink* sink) : sink_(sink) {}

  absl::Status Feed(absl::string_view bytes);
  // After the last Feed: OK only when the end marker was read.
  absl::Status Finish();
  // The entry whose data is being read ("" between entries), for naming it in errors.
  const std::string& current_name() const { return entry_.name; }

 private:
  enum class Phase { kHeader, kData, kPadding, kSecondZero, kEnd };

  // Each consumes from the front of `bytes` what its phase takes.
  absl::Status TakeBlock(absl::string_view* bytes);
  absl::Status TakeData(absl::string_view* bytes);
  void TakePadding(absl::string_view* bytes);
  absl::Status OnBlock(absl::string_view block);
  absl::Status OnHeader(const tar::Header& header);
  absl::Status EndOfData();
  absl::Status ApplyMetadata();

  TarEntrySink* const sink_;
  absl::Status error_;
  Phase phase_ = Phase::kHeader;
  std::string block_;  // a header block split across Feeds
  // The entry being read: a real one, or a metadata header whose data goes to metadata_.
  TarEntry entry_;
  bool entry_is_metadata_ = false;
  int64_t data_left_ = 0;
  int64_t padding_left_ = 0;
  std::string metadata_;
  // What 'x', 'L' and 'K' headers said about the next real entry.
  tar::PaxOverrides pending_;
};

}  // namespace gradhub::code
