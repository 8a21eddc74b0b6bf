#include "services/common/text_rules.h"

#include "absl/strings/str_cat.h"

namespace gradhub {

// Follows the table of well-formed byte sequences in the Unicode standard (section 3.9,
// table 3-7).
size_t Utf8SequenceLength(std::string_view text, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(text[i + k]); };
  const unsigned char lead = byte(0);
  if (lead < 0x80) return 1;
  size_t length = 0;
  unsigned char low = 0x80, high = 0xBF;  // the range of the second byte
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) low = 0xA0;   // overlong
    if (lead == 0xED) high = 0x9F;  // surrogates
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) low = 0x90;   // overlong
    if (lead == 0xF4) high = 0x8F;  // past U+10FFFF
  } else {
    return 0;
  }
  if (i + length > text.size() || byte(1) < low || byte(1) > high) return 0;
  for (size_t k = 2; k < length; ++k) {
    if (byte(k) < 0x80 || byte(k) > 0xBF) return 0;
  }
  return length;
}

namespace {

// The offset of the first byte that starts no valid sequence, or npos.
size_t FirstInvalidByte(std::string_view text) {
  for (size_t i = 0; i < text.size();) {
    const size_t length = Utf8SequenceLength(text, i);
    if (length == 0) return i;
    i += length;
  }
  return std::string_view::npos;
}

}  // namespace

bool IsValidUtf8(std::string_view text) { return FirstInvalidByte(text) == std::string_view::npos; }

size_t CountCharacters(std::string_view text) {
  size_t count = 0;
  for (size_t i = 0; i < text.size(); ++count) {
    const size_t length = Utf8SequenceLength(text, i);
    i += length == 0 ? 1 : length;
  }
  return count;
}

std::string TextProblem(std::string_view text) {
  if (const size_t nul = text.find('\0'); nul != std::string_view::npos) {
    return absl::StrCat("holds a NUL character (at byte ", nul, ")");
  }
  if (const size_t bad = FirstInvalidByte(text); bad != std::string_view::npos) {
    return absl::StrCat("is not valid UTF-8 (at byte ", bad, ")");
  }
  return "";
}

std::string TextLimitProblem(std::string_view text, size_t max_characters) {
  if (std::string problem = TextProblem(text); !problem.empty()) return problem;
  // Each character takes at least one byte: most texts are decided without counting.
  if (text.size() <= max_characters) return "";
  const size_t characters = CountCharacters(text);
  if (characters <= max_characters) return "";
  return absl::StrCat("is ", characters, " characters long; at most ", max_characters,
                      " (characters are Unicode code points)");
}

absl::Status CheckTexts(const std::vector<NamedText>& texts) {
  for (const auto& [name, text] : texts) {
    if (std::string problem = TextProblem(text); !problem.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": ", problem));
    }
  }
  return absl::OkStatus();
}

}  // namespace gradhub
