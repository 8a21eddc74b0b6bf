#include "services/common/code_archive/tar_format.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace gradhub::code::tar {
namespace {

// Where each field of a header block lies (POSIX.1-1988 ustar).
struct Field {
  size_t offset;
  size_t length;
};
constexpr Field kName{0, 100};
constexpr Field kMode{100, 8};
constexpr Field kUid{108, 8};
constexpr Field kGid{116, 8};
constexpr Field kSize{124, 12};
constexpr Field kMtime{136, 12};
constexpr Field kChecksum{148, 8};
constexpr size_t kTypeOffset = 156;
constexpr Field kLinkName{157, 100};
constexpr Field kMagic{257, 6};
constexpr Field kVersion{263, 2};
constexpr Field kDevMajor{329, 8};
constexpr Field kDevMinor{337, 8};
constexpr Field kPrefix{345, 155};

constexpr absl::string_view kPosixMagic("ustar\0", 6);  // GNU's is "ustar " and has no prefix
constexpr int64_t kMaxOctalSize = 077777777777;         // 11 octal digits
constexpr absl::string_view kPaxHeaderName = "././@PaxHeader";  // as Python's tarfile names it

absl::string_view FieldOf(absl::string_view block, Field field) {
  return block.substr(field.offset, field.length);
}

// A string field up to its first NUL (the whole field when it has none).
std::string StringOf(absl::string_view block, Field field) {
  absl::string_view bytes = FieldOf(block, field);
  return std::string(bytes.substr(0, bytes.find('\0')));
}

// The sums a header's checksum may hold: of unsigned bytes (POSIX), or of signed ones (some
// old tars), with the checksum field itself counted as spaces.
std::pair<int64_t, int64_t> ChecksumsOf(absl::string_view block) {
  int64_t unsigned_sum = 0;
  int64_t signed_sum = 0;
  for (size_t i = 0; i < kBlockBytes; ++i) {
    const bool in_field = i >= kChecksum.offset && i < kChecksum.offset + kChecksum.length;
    const char c = in_field ? ' ' : block[i];
    unsigned_sum += static_cast<unsigned char>(c);
    signed_sum += static_cast<signed char>(c);
  }
  return {unsigned_sum, signed_sum};
}

bool IsAscii(absl::string_view text) {
  return std::all_of(text.begin(), text.end(),
                     [](char c) { return static_cast<unsigned char>(c) < 0x80; });
}

absl::StatusOr<int64_t> ParseBase256(absl::string_view field) {
  if (static_cast<unsigned char>(field[0]) & 0x40) {
    return absl::InvalidArgumentError("a negative number in a header field");
  }
  int64_t value = static_cast<unsigned char>(field[0]) & 0x3f;
  for (size_t i = 1; i < field.size(); ++i) {
    if (value > (std::numeric_limits<int64_t>::max() >> 8)) {
      return absl::InvalidArgumentError("a header number too large");
    }
    value = (value << 8) | static_cast<unsigned char>(field[i]);
  }
  return value;
}

void PutBytes(char* block, Field field, absl::string_view text) {
  std::memcpy(block + field.offset, text.data(), std::min(text.size(), field.length));
}

// Zero-padded octal filling the field but its last byte, which stays NUL.
void PutOctal(char* block, Field field, int64_t value) {
  const std::string digits =
      absl::StrFormat("%0*o", static_cast<int>(field.length - 1), static_cast<uint64_t>(value));
  PutBytes(block, field, digits);
}

// "<length> <key>=<value>\n", where the length counts its own digits.
std::string PaxRecord(absl::string_view key, absl::string_view value) {
  const size_t body = key.size() + value.size() + 3;  // ' ', '=', '\n'
  size_t length = body + absl::StrCat(body).size();
  if (absl::StrCat(length).size() > absl::StrCat(body).size()) ++length;
  return absl::StrCat(length, " ", key, "=", value, "\n");
}

bool FitsUstar(absl::string_view text) { return text.size() <= kName.length && IsAscii(text); }

std::string HeaderNameOf(const EntryToWrite& entry) {
  return entry.type == kDirectory ? absl::StrCat(entry.path, "/") : std::string(entry.path);
}

void AppendBlock(absl::string_view name, char type, uint32_t mode, int64_t size,
                 absl::string_view link_target, std::string* out) {
  char block[kBlockBytes] = {};
  PutBytes(block, kName, name);
  PutOctal(block, kMode, mode);
  PutOctal(block, kUid, 0);
  PutOctal(block, kGid, 0);
  PutOctal(block, kSize, size);
  PutOctal(block, kMtime, 0);
  block[kTypeOffset] = type;
  PutBytes(block, kLinkName, link_target);
  PutBytes(block, kMagic, kPosixMagic);
  PutBytes(block, kVersion, "00");
  PutOctal(block, kDevMajor, 0);
  PutOctal(block, kDevMinor, 0);
  const int64_t checksum = ChecksumsOf(absl::string_view(block, kBlockBytes)).first;
  PutBytes(block, kChecksum, absl::StrFormat("%06o", checksum));
  block[kChecksum.offset + 6] = '\0';
  block[kChecksum.offset + 7] = ' ';
  out->append(block, kBlockBytes);
}

}  // namespace

bool IsZeroBlock(absl::string_view block) {
  return std::all_of(block.begin(), block.end(), [](char c) { return c == '\0'; });
}

std::string NameFieldOf(absl::string_view block) { return StringOf(block, kName); }

absl::StatusOr<int64_t> ParseNumber(absl::string_view field) {
  if (!field.empty() && (static_cast<unsigned char>(field[0]) & 0x80)) return ParseBase256(field);
  size_t i = 0;
  while (i < field.size() && field[i] == ' ') ++i;
  int64_t value = 0;
  for (; i < field.size() && field[i] >= '0' && field[i] <= '7'; ++i) {
    if (value > (std::numeric_limits<int64_t>::max() >> 3)) {
      return absl::InvalidArgumentError("a header number too large");
    }
    value = value * 8 + (field[i] - '0');
  }
  for (; i < field.size(); ++i) {
    if (field[i] != ' ' && field[i] != '\0') {
      return absl::InvalidArgumentError("a header number field that is not octal");
    }
  }
  return value;
}

absl::StatusOr<Header> ParseHeader(absl::string_view block) {
  const absl::StatusOr<int64_t> checksum = ParseNumber(FieldOf(block, kChecksum));
  const auto [unsigned_sum, signed_sum] = ChecksumsOf(block);
  if (!checksum.ok() || (*checksum != unsigned_sum && *checksum != signed_sum)) {
    return absl::InvalidArgumentError(
        "bad header checksum (the archive is corrupt, or not a tar archive)");
  }
  Header header;
  header.type = block[kTypeOffset];
  header.name = StringOf(block, kName);
  const std::string prefix = StringOf(block, kPrefix);
  if (FieldOf(block, kMagic) == kPosixMagic && !prefix.empty()) {
    header.name = absl::StrCat(prefix, "/", header.name);
  }
  header.link_target = StringOf(block, kLinkName);
  absl::StatusOr<int64_t> size = ParseNumber(FieldOf(block, kSize));
  absl::StatusOr<int64_t> mode = ParseNumber(FieldOf(block, kMode));
  if (!size.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("size: ", size.status().message()));
  }
  if (!mode.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("mode: ", mode.status().message()));
  }
  header.size = *size;
  header.mode = static_cast<uint32_t>(*mode & 07777);
  return header;
}

absl::Status ParsePaxRecords(absl::string_view data, PaxOverrides* overrides) {
  while (!data.empty()) {
    const size_t space = data.find(' ');
    size_t length = 0;
    if (space == absl::string_view::npos || !absl::SimpleAtoi(data.substr(0, space), &length) ||
        length <= space + 1 || length > data.size() || data[length - 1] != '\n') {
      return absl::InvalidArgumentError("a malformed pax header record");
    }
    const absl::string_view body = data.substr(space + 1, length - space - 2);
    data.remove_prefix(length);
    const size_t equals = body.find('=');
    if (equals == absl::string_view::npos) {
      return absl::InvalidArgumentError("a pax header record without '='");
    }
    const absl::string_view key = body.substr(0, equals);
    const absl::string_view value = body.substr(equals + 1);
    if (key == "path") {
      overrides->path = std::string(value);
    } else if (key == "linkpath") {
      overrides->link_target = std::string(value);
    } else if (key == "size") {
      int64_t size = 0;
      if (!absl::SimpleAtoi(value, &size) || size < 0) {
        return absl::InvalidArgumentError("a pax size record that is not a size");
      }
      overrides->size = size;
    } else if (absl::StartsWith(key, "GNU.sparse.")) {
      return absl::InvalidArgumentError("a sparse file (pax GNU.sparse records); not supported");
    }
  }
  return absl::OkStatus();
}

std::string PaxDataFor(const EntryToWrite& entry) {
  std::string records;
  const std::string name = HeaderNameOf(entry);
  if (!FitsUstar(name)) records += PaxRecord("path", name);
  if (!FitsUstar(entry.link_target)) records += PaxRecord("linkpath", entry.link_target);
  if (entry.size > kMaxOctalSize) records += PaxRecord("size", absl::StrCat(entry.size));
  return records;
}

int64_t HeaderBytesOf(const EntryToWrite& entry) {
  const int64_t pax = static_cast<int64_t>(PaxDataFor(entry).size());
  return kBlockBytes + (pax == 0 ? 0 : kBlockBytes + pax + PaddingOf(pax));
}

void AppendHeader(const EntryToWrite& entry, std::string* out) {
  const std::string pax = PaxDataFor(entry);
  if (!pax.empty()) {
    AppendBlock(kPaxHeaderName, kPaxEntry, 0644, static_cast<int64_t>(pax.size()), "", out);
    out->append(pax);
    out->append(PaddingOf(static_cast<int64_t>(pax.size())), '\0');
  }
  AppendBlock(HeaderNameOf(entry), entry.type, entry.mode, std::min(entry.size, kMaxOctalSize),
              entry.link_target, out);
}

}  // namespace gradhub::code::tar
