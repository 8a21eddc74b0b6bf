// The bytes of a tar archive: the 512-byte header block (POSIX ustar, with GNU's and v7's
// variants read too), its numbers and checksum, and pax extended-header records. Pure
// functions, no I/O; thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace gradhub::code::tar {

inline constexpr size_t kBlockBytes = 512;

// The header's type flags we name (POSIX.1-2001 and GNU tar's).
inline constexpr char kRegular = '0';
inline constexpr char kRegularOld = '\0';  // v7: a regular file, a directory if the name ends in /
inline constexpr char kHardLink = '1';
inline constexpr char kSymlink = '2';
inline constexpr char kCharDevice = '3';
inline constexpr char kBlockDevice = '4';
inline constexpr char kDirectory = '5';
inline constexpr char kFifo = '6';
inline constexpr char kContiguous = '7';
inline constexpr char kPaxEntry = 'x';   // pax records for the next entry
inline constexpr char kPaxGlobal = 'g';  // pax records for all later entries (skipped here)
inline constexpr char kGnuLongName = 'L';
inline constexpr char kGnuLongLink = 'K';

// The bytes up to the next multiple of kBlockBytes.
inline int64_t PaddingOf(int64_t size) {
  return (static_cast<int64_t>(kBlockBytes) - size % static_cast<int64_t>(kBlockBytes)) %
         static_cast<int64_t>(kBlockBytes);
}

// A header block's fields, as the block spells them (pax and GNU long names not yet applied).
struct Header {
  std::string name;  // ustar: prefix + "/" + name when the prefix is set
  std::string link_target;
  int64_t size = 0;
  uint32_t mode = 0;
  char type = kRegular;
};

bool IsZeroBlock(absl::string_view block);

// The name field alone (up to its first NUL), for naming a block that does not parse.
std::string NameFieldOf(absl::string_view block);

// Parses one block (kBlockBytes). Errors (plain reasons, no entry name): a checksum that does
// not match, a size or mode field that is not a number, a negative size.
absl::StatusOr<Header> ParseHeader(absl::string_view block);

// A numeric field: octal digits between optional spaces and NULs, or GNU's base-256 (the first
// byte's high bit set).
absl::StatusOr<int64_t> ParseNumber(absl::string_view field);

// What an 'x' header says about its entry: the keys we apply. Others (times, owners,
// attributes) change nothing we keep and are skipped.
struct PaxOverrides {
  std::optional<std::string> path;
  std::optional<std::string> link_target;
  std::optional<int64_t> size;
};

// Parses the records "<length> <key>=<value>\n" of a pax header's data into `overrides`.
// GNU.sparse.* keys are refused: a sparse file's data is not its contents.
absl::Status ParsePaxRecords(absl::string_view data, PaxOverrides* overrides);

// What PackDirectory writes for one entry.
struct EntryToWrite {
  absl::string_view path;  // relative, without a trailing "/"
  char type = kRegular;    // kRegular, kDirectory or kSymlink
  uint32_t mode = 0644;
  int64_t size = 0;
  absl::string_view link_target;
};

// The pax records the entry needs ("" when ustar's fields hold it all): a path or link target
// over 100 bytes or not ASCII, a size over ustar's 11 octal digits.
std::string PaxDataFor(const EntryToWrite& entry);

// The bytes of the entry's header blocks: the pax header and its padded data when needed, then
// the ustar block.
int64_t HeaderBytesOf(const EntryToWrite& entry);

// Appends the entry's header blocks (HeaderBytesOf of them) to `out`: deterministic, with mtime
// 0, owners 0 and unnamed.
void AppendHeader(const EntryToWrite& entry, std::string* out);

}  // namespace gradhub::code::tar
