// IgnoreRules: the patterns of a .gradhubignore (the subset of gitignore that code_archive.h
// describes), and whether they exclude a path. Immutable once parsed; thread-safe.
#pragma once

#include <string>
#include <vector>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"

namespace gradhub::code {

class IgnoreRules {
 public:
  // No patterns: nothing excluded.
  IgnoreRules() = default;

  // INVALID_ARGUMENT naming the line of a pattern outside the subset ("[...]", "\").
  static absl::StatusOr<IgnoreRules> Parse(absl::string_view text);
  // `dir`/.gradhubignore parsed; no patterns when there is no such file.
  static absl::StatusOr<IgnoreRules> Load(const std::string& dir);

  // Whether `path` (relative, "/"-separated, no trailing "/") is excluded: the last pattern
  // that matches decides. Callers do not ask about what is inside an excluded directory.
  bool Excludes(absl::string_view path, bool is_directory) const;

 private:
  struct Pattern {
    std::vector<std::string> components;  // "**" stands for any number of folders
    bool negated = false;                 // "!pattern"
    bool directories_only = false;        // "pattern/"
  };

  static absl::StatusOr<Pattern> ParsePattern(absl::string_view line);

  std::vector<Pattern> patterns_;
};

}  // namespace gradhub::code
