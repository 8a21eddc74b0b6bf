#include "services/common/code_archive/names.h"

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

namespace gradhub::code {
namespace {

// The length of the UTF-8 sequence that starts at text[i], 0 if none valid does (overlong
// forms, surrogates and code points past U+10FFFF included).
size_t Utf8SequenceAt(absl::string_view text, size_t i) {
  const unsigned char lead = static_cast<unsigned char>(text[i]);
  if (lead < 0x80) return 1;
  size_t length = 0;
  uint32_t point = 0;
  uint32_t smallest = 0;
  if ((lead & 0xE0) == 0xC0) {
    length = 2, point = lead & 0x1F, smallest = 0x80;
  } else if ((lead & 0xF0) == 0xE0) {
    length = 3, point = lead & 0x0F, smallest = 0x800;
  } else if ((lead & 0xF8) == 0xF0) {
    length = 4, point = lead & 0x07, smallest = 0x10000;
  } else {
    return 0;
  }
  if (i + length > text.size()) return 0;
  for (size_t k = 1; k < length; ++k) {
    const unsigned char next = static_cast<unsigned char>(text[i + k]);
    if ((next & 0xC0) != 0x80) return 0;
    point = (point << 6) | (next & 0x3F);
  }
  const bool surrogate = point >= 0xD800 && point <= 0xDFFF;
  return point < smallest || point > 0x10FFFF || surrogate ? 0 : length;
}

// Valid UTF-8 without C0 controls, DEL, or C1 controls (U+0080..U+009F, "\xc2\x80".."\xc2\x9f").
absl::Status CheckCharacters(absl::string_view text) {
  if (!IsValidUtf8(text)) return absl::InvalidArgumentError("is not valid UTF-8");
  for (size_t i = 0; i < text.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    const bool c1 = c == 0xC2 && i + 1 < text.size() &&
                    static_cast<unsigned char>(text[i + 1]) >= 0x80 &&
                    static_cast<unsigned char>(text[i + 1]) <= 0x9F;
    if (c < 0x20 || c == 0x7F || c1) {
      const std::string which =
          c1 ? absl::StrFormat("U+%04X", text[i + 1] & 0xFF) : absl::StrFormat("0x%02x", c);
      return absl::InvalidArgumentError(
          absl::StrFormat("holds a control character (byte %d, %s)", i, which));
    }
  }
  return absl::OkStatus();
}

}  // namespace

bool IsValidUtf8(absl::string_view text) {
  for (size_t i = 0; i < text.size();) {
    const size_t length = Utf8SequenceAt(text, i);
    if (length == 0) return false;
    i += length;
  }
  return true;
}

std::string Quoted(absl::string_view text) {
  const bool utf8 = IsValidUtf8(text);
  std::string out = "\"";
  for (const char c : text) {
    const unsigned char byte = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (byte < 0x20 || byte == 0x7F || (!utf8 && byte >= 0x80)) {
      out += absl::StrFormat("\\x%02x", byte);
    } else {
      out += c;
    }
  }
  return out + "\"";
}

absl::Status EntryError(absl::string_view name, absl::string_view reason) {
  return WithEntryName(name, absl::InvalidArgumentError(reason));
}

absl::Status WithEntryName(absl::string_view name, const absl::Status& status) {
  return absl::Status(status.code(),
                      absl::StrCat("archive entry ", Quoted(name), ": ", status.message()));
}

absl::StatusOr<std::vector<std::string>> SplitName(absl::string_view name) {
  if (name.empty()) return absl::InvalidArgumentError("an empty name");
  if (name.front() == '/') return absl::InvalidArgumentError("an absolute path");
  const absl::Status characters = CheckCharacters(name);
  if (!characters.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("the name ", characters.message()));
  }
  if (name.size() > kMaxPathBytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("a name of %d bytes, over %d", name.size(), kMaxPathBytes));
  }
  std::vector<std::string> components;
  for (absl::string_view part : absl::StrSplit(name, '/')) {
    if (part.empty() || part == ".") continue;
    if (part == "..") return absl::InvalidArgumentError("a \"..\" component");
    if (part.size() > kMaxComponentBytes) {
      return absl::InvalidArgumentError(absl::StrFormat("a name component of %d bytes, over %d",
                                                        part.size(), kMaxComponentBytes));
    }
    components.emplace_back(part);
  }
  return components;
}

absl::Status CheckLinkTarget(absl::string_view target, size_t folder_depth) {
  const std::string what = absl::StrCat("a symbolic link to ", Quoted(target));
  if (target.empty()) return absl::InvalidArgumentError("a symbolic link with an empty target");
  if (target.front() == '/') {
    return absl::InvalidArgumentError(absl::StrCat(what, ": absolute, out of the tree"));
  }
  const absl::Status characters = CheckCharacters(target);
  if (!characters.ok() || target.size() > kMaxPathBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", characters.ok() ? "too long" : characters.message()));
  }
  size_t climbs = 0;
  bool named = false;
  for (absl::string_view part : absl::StrSplit(target, '/')) {
    if (part.empty() || part == ".") continue;
    if (part != "..") {
      named = true;
    } else if (named) {
      return absl::InvalidArgumentError(
          absl::StrCat(what,
                       ": \"..\" after a name (through a link, it would climb from the link's "
                       "target); write the target without it"));
    } else if (++climbs > folder_depth) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": leads out of the tree"));
    }
  }
  return absl::OkStatus();
}

}  // namespace gradhub::code
