// The text rules of an archive's names and link targets (rules 1 and 3 of code_archive.h),
// shared by the packer, which refuses a tree it could not ship, and by the checks of the store
// and the agent. Pure functions; thread-safe.
#pragma once

#include <cstddef>
#include <string>
#include <vector>
#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace gradhub::code {

inline constexpr size_t kMaxPathBytes = 4095;      // PATH_MAX less its NUL
inline constexpr size_t kMaxComponentBytes = 255;  // NAME_MAX

bool IsValidUtf8(absl::string_view text);

// `text` between double quotes, safe to print: control characters, quotes and backslashes
// escaped, and every byte past ASCII too when the text is not valid UTF-8. A hostile name
// cannot forge a log line.
std::string Quoted(absl::string_view text);

// INVALID_ARGUMENT `archive entry "<name>": <reason>`: how every refusal names its entry.
absl::Status EntryError(absl::string_view name, absl::string_view reason);
// `status` with the entry named the same way, its code kept (an I/O error while unpacking).
absl::Status WithEntryName(absl::string_view name, const absl::Status& status);

// Rule 1: the components of an entry's name, "." and empty ones dropped ("./" gives none: the
// root). INVALID_ARGUMENT with the plain reason otherwise: empty, absolute, "..", not UTF-8, a
// control character, too long.
absl::StatusOr<std::vector<std::string>> SplitName(absl::string_view name);

// Rule 3, for a link `folder_depth` folders below the root (a link "a/b/l" is 2 deep): the
// target is relative, valid UTF-8 without control characters, and its ".." components all come
// before any name and number at most `folder_depth`. INVALID_ARGUMENT with the reason otherwise.
absl::Status CheckLinkTarget(absl::string_view target, size_t folder_depth);

}  // namespace gradhub::code
