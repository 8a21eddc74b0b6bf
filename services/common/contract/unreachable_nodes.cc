#include "services/common/contract/unreachable_nodes.h"

#include <algorithm>

namespace gradhub {
namespace {

constexpr std::string_view kVerb = " cannot reach ";
constexpr std::string_view kNodePrefix = "nodes/";

// A node name's characters (the api's resource names: letters, digits, '-', '_', '.').
bool IsNameChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '_' || c == '.';
}

// "nodes/NAME" starting at `at`, or "" when there is none; `end` is set past it.
std::string NodeAt(std::string_view text, size_t at, size_t* end) {
  if (text.substr(at, kNodePrefix.size()) != kNodePrefix) return "";
  size_t i = at + kNodePrefix.size();
  while (i < text.size() && IsNameChar(text[i])) ++i;
  // A sentence may end right after the name.
  while (i > at + kNodePrefix.size() && text[i - 1] == '.') --i;
  if (i == at + kNodePrefix.size()) return "";
  *end = i;
  return std::string(text.substr(at, i - at));
}

}  // namespace

std::string UnreachableNodesStatement(const std::string& from, const std::vector<std::string>& to) {
  std::string statement = from + std::string(kVerb);
  for (size_t i = 0; i < to.size(); ++i) statement += (i == 0 ? "" : ", ") + to[i];
  return statement;
}

std::vector<std::pair<std::string, std::string>> UnreachablePairs(std::string_view text) {
  std::vector<std::pair<std::string, std::string>> pairs;
  for (size_t verb = text.find(kVerb); verb != std::string_view::npos;
       verb = text.find(kVerb, verb + 1)) {
    // The subject: the "nodes/NAME" that ends right before the verb.
    size_t start = verb;
    while (start > 0 && IsNameChar(text[start - 1])) --start;
    if (start < kNodePrefix.size()) continue;
    start -= kNodePrefix.size();
    size_t end = 0;
    const std::string from = NodeAt(text, start, &end);
    if (from.empty() || end != verb) continue;
    // The objects: "nodes/X", then ", nodes/Y" as long as they come.
    size_t at = verb + kVerb.size();
    for (std::string to = NodeAt(text, at, &end); !to.empty(); to = NodeAt(text, at, &end)) {
      if (to != from &&
          std::find(pairs.begin(), pairs.end(), std::make_pair(from, to)) == pairs.end()) {
        pairs.emplace_back(from, to);
      }
      if (text.substr(end, 2) != ", ") break;
      at = end + 2;
    }
  }
  return pairs;
}

}  // namespace gradhub
