#include "services/common/code_archive/gradhub_ignore.h"

#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace gradhub::code {
namespace {

constexpr absl::string_view kAnyFolders = "**";

// One component against a pattern of literal characters, "*" and "?" (neither crosses a "/":
// a component has none).
bool GlobMatches(absl::string_view pattern, absl::string_view name) {
  size_t p = 0;
  size_t n = 0;
  size_t star = absl::string_view::npos;  // the last "*" seen, to retry with one more character
  size_t star_n = 0;
  while (n < name.size()) {
    if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      star_n = n;
    } else if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == name[n])) {
      ++p, ++n;
    } else if (star != absl::string_view::npos) {
      p = star + 1;
      n = ++star_n;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

// pattern[p..] against path[q..]. "**" matches any number of components, but a trailing one
// ("build/**") at least one: what is inside, not the folder itself.
bool MatchesFrom(const std::vector<std::string>& pattern, size_t p,
                 const std::vector<absl::string_view>& path, size_t q) {
  if (p == pattern.size()) return q == path.size();
  if (pattern[p] == kAnyFolders) {
    if (p + 1 == pattern.size()) return q < path.size();
    for (size_t next = q; next <= path.size(); ++next) {
      if (MatchesFrom(pattern, p + 1, path, next)) return true;
    }
    return false;
  }
  return q < path.size() && GlobMatches(pattern[p], path[q]) &&
         MatchesFrom(pattern, p + 1, path, q + 1);
}

}  // namespace

absl::StatusOr<IgnoreRules> IgnoreRules::Parse(absl::string_view text) {
  IgnoreRules rules;
  int number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++number;
    while (!line.empty() && (line.back() == ' ' || line.back() == '\t' || line.back() == '\r')) {
      line.remove_suffix(1);
    }
    if (line.empty() || line.front() == '#') continue;
    absl::StatusOr<Pattern> pattern = ParsePattern(line);
    if (!pattern.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(".gradhubignore line ", number, ": ", pattern.status().message()));
    }
    rules.patterns_.push_back(*std::move(pattern));
  }
  return rules;
}

absl::StatusOr<IgnoreRules> IgnoreRules::Load(const std::string& dir) {
  std::ifstream file(dir + "/.gradhubignore", std::ios::binary);
  if (!file) return IgnoreRules();
  std::stringstream text;
  text << file.rdbuf();
  return Parse(text.str());
}

absl::StatusOr<IgnoreRules::Pattern> IgnoreRules::ParsePattern(absl::string_view line) {
  Pattern pattern;
  pattern.negated = absl::ConsumePrefix(&line, "!");
  if (line.find_first_of("[\\") != absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "\"", line, "\": character classes ([...]) and backslash escapes are not supported"));
  }
  while (absl::ConsumeSuffix(&line, "/")) pattern.directories_only = true;
  if (absl::StripLeadingAsciiWhitespace(line).empty()) {
    return absl::InvalidArgumentError("an empty pattern");
  }
  // A "/" at the start or inside anchors the pattern to the top; without, it matches at any
  // depth, as if it began with "**/".
  const bool anchored = line.find('/') != absl::string_view::npos;
  if (!anchored) pattern.components.emplace_back(kAnyFolders);
  for (absl::string_view part : absl::StrSplit(line, '/', absl::SkipEmpty())) {
    pattern.components.emplace_back(part);
  }
  return pattern;
}

bool IgnoreRules::Excludes(absl::string_view path, bool is_directory) const {
  const std::vector<absl::string_view> components = absl::StrSplit(path, '/', absl::SkipEmpty());
  bool excluded = false;
  for (const Pattern& pattern : patterns_) {
    if (pattern.directories_only && !is_directory) continue;
    if (MatchesFrom(pattern.components, 0, components, 0)) excluded = !pattern.negated;
  }
  return excluded;
}

}  // namespace gradhub::code
