// What every string a client sends must be before gradhub stores or matches it, and how its
// length limits count. One place, so that every field of every request (REST, gRPC, the job
// spec's YAML) follows the same rules:
//   - valid UTF-8 (RFC 3629: no overlong forms, no surrogates, nothing past U+10FFFF), which
//     proto3 strings and PostgreSQL's text both require;
//   - no NUL character: PostgreSQL's text cannot hold one, and libpq passes a parameter as a C
//     string, so a NUL would silently cut it short (a request id "a\0b" would be "a");
//   - lengths counted in characters, i.e. Unicode code points, as users count them: a limit of
//     256 takes 256 letters whatever their script, and every message says so.
// Pure functions, thread-safe.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace gradhub {

bool IsValidUtf8(std::string_view text);

// The length of the valid UTF-8 sequence starting at text[i], or 0 when none starts there
// (i < text.size()). For code that repairs text byte by byte (U+FFFD for each bad byte).
size_t Utf8SequenceLength(std::string_view text, size_t i);

// The code points of `text`; a byte that starts no valid sequence counts as one.
size_t CountCharacters(std::string_view text);

// "" when `text` may be stored; otherwise what is wrong, for a message that names the field:
// "holds a NUL character (at byte 3)" or "is not valid UTF-8 (at byte 7)".
std::string TextProblem(std::string_view text);

// "" when `text` is valid (TextProblem) and at most `max_characters` long; otherwise what is
// wrong, e.g. "is 300 characters long; at most 256 (characters are Unicode code points)".
std::string TextLimitProblem(std::string_view text, size_t max_characters);

// A request's loose texts (query parameters, path segments), each with the name a client
// knows it by: INVALID_ARGUMENT "<name>: <problem>" for the first with a TextProblem.
using NamedText = std::pair<std::string, std::string>;
absl::Status CheckTexts(const std::vector<NamedText>& texts);

}  // namespace gradhub
