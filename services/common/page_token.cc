#include "services/common/page_token.h"

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "services/common/text_rules.h"

namespace gradhub {
namespace {

// Long enough for any key of ours (a list name, a time and a UUID are under 80 bytes); a longer
// token is refused before it is decoded.
constexpr size_t kMaxTokenBytes = 1024;

// Debian builds Abseil with its own string_view, not std::string_view.
absl::string_view Absl(std::string_view text) {
  return absl::string_view(text.data(), text.size());
}

absl::Status NotOurs() {
  return absl::InvalidArgumentError("page_token: not a token this server returned");
}

}  // namespace

std::string MakePageToken(std::string_view list, std::initializer_list<std::string_view> key) {
  std::vector<absl::string_view> parts = {Absl(list)};
  for (std::string_view part : key) parts.push_back(Absl(part));
  return absl::WebSafeBase64Escape(absl::StrJoin(parts, "\n"));
}

absl::StatusOr<std::vector<std::string>> ReadPageToken(std::string_view token,
                                                       std::string_view list, size_t parts) {
  std::string text;
  if (token.size() > kMaxTokenBytes || !absl::WebSafeBase64Unescape(Absl(token), &text) ||
      !TextProblem(text).empty()) {
    return NotOurs();
  }
  std::vector<std::string> key = absl::StrSplit(text, '\n');
  if (key.size() != parts + 1 || key.front() != list) return NotOurs();
  key.erase(key.begin());
  return key;
}

absl::StatusOr<std::string> ReadNamePageToken(std::string_view token, std::string_view list) {
  if (token.empty()) return std::string();
  absl::StatusOr<std::vector<std::string>> key = ReadPageToken(token, list, 1);
  if (!key.ok()) return key.status();
  return std::move(key->front());
}

absl::StatusOr<int64_t> PageTokenInt(std::string_view part, int64_t min, int64_t max) {
  int64_t value = 0;
  if (!absl::SimpleAtoi(Absl(part), &value) || value < min || value > max) return NotOurs();
  return value;
}

}  // namespace gradhub
