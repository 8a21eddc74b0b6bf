// Page tokens of every List call: where the next page starts, opaque to clients and checked
// when they come back, so that no token reaches SQL unless this server could have made it.
//
// A token is URL-safe base64 (unpadded) of the list's name and the sort key of the last item
// of the page, newline-separated. Clients only hand it back; decoding checks, in order:
//   1. it is base64 of valid UTF-8 without NUL (text_rules.h);
//   2. it names the same list and has as many key parts as that list's keys;
//   3. each integer part is an integer within the range the caller gives (a job's create
//      time within the years 1970..9999, an id >= 0), checked by PageTokenInt.
// Any failure is INVALID_ARGUMENT "page_token: not a token this server returned", never an
// error from the database. Pure functions, thread-safe.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace gradhub {

// The largest time a protobuf Timestamp holds (9999-12-31T23:59:59.999999Z), in microseconds
// since the epoch: the upper bound of a time in a page token.
inline constexpr int64_t kMaxTimestampMicros = 253402300799999999;

// The token of a page of `list` whose last item sorts at `key`. No key part may hold '\n'.
std::string MakePageToken(std::string_view list, std::initializer_list<std::string_view> key);

// The key parts of `token`, which must be MakePageToken's of `list` with `parts` parts.
absl::StatusOr<std::vector<std::string>> ReadPageToken(std::string_view token,
                                                       std::string_view list, size_t parts);

// For a list sorted by one name: the name in `token`, "" when the token is empty (the first
// page).
absl::StatusOr<std::string> ReadNamePageToken(std::string_view token, std::string_view list);

// One key part as an integer in [min, max].
absl::StatusOr<int64_t> PageTokenInt(std::string_view part, int64_t min, int64_t max);

}  // namespace gradhub
