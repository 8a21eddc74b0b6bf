#include "services/common/code_archive/entry_rules.h"

#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "services/common/code_archive/names.h"
#include "services/common/status_macros.h"

namespace gradhub::code {
namespace {

constexpr absl::string_view kOnlyThese =
    "; an archive holds only regular files, directories and symbolic links";

// "256 MiB", "1.5 GiB", "700 bytes".
std::string SizeText(int64_t bytes) {
  constexpr std::pair<int64_t, const char*> kUnits[] = {
      {int64_t{1} << 30, "GiB"}, {int64_t{1} << 20, "MiB"}, {int64_t{1} << 10, "KiB"}};
  for (const auto& [unit, name] : kUnits) {
    if (bytes < unit) continue;
    if (bytes % unit == 0) return absl::StrFormat("%d %s", bytes / unit, name);
    return absl::StrFormat("%.1f %s", static_cast<double>(bytes) / static_cast<double>(unit), name);
  }
  return absl::StrFormat("%d bytes", bytes);
}

// Exact bytes where rounding would print the value and the limit alike.
std::string BytesOverLimit(int64_t bytes, int64_t limit, absl::string_view what,
                           absl::string_view flag) {
  std::string value = SizeText(bytes);
  std::string bound = SizeText(limit);
  if (value == bound) {
    value = absl::StrFormat("%d bytes", bytes);
    bound = absl::StrFormat("%d bytes", limit);
  }
  return absl::StrFormat("%s of %s is over the limit of %s (%s)", value, what, bound, flag);
}

absl::StatusOr<EntryKind> KindOf(const TarEntry& entry) {
  switch (entry.type) {
    case tar::kRegular:
      return EntryKind::kFile;
    case tar::kRegularOld:  // v7 marks a directory by the name's trailing "/"
      return !entry.name.empty() && entry.name.back() == '/' ? EntryKind::kDirectory
                                                             : EntryKind::kFile;
    case tar::kDirectory:
      return EntryKind::kDirectory;
    case tar::kSymlink:
      return EntryKind::kSymlink;
    case tar::kHardLink:
      return absl::InvalidArgumentError(
          absl::StrCat("a hard link (to ", Quoted(entry.link_target), ")", kOnlyThese));
    case tar::kCharDevice:
      return absl::InvalidArgumentError(absl::StrCat("a character device", kOnlyThese));
    case tar::kBlockDevice:
      return absl::InvalidArgumentError(absl::StrCat("a block device", kOnlyThese));
    case tar::kFifo:
      return absl::InvalidArgumentError(absl::StrCat("a FIFO", kOnlyThese));
    case tar::kContiguous:
      return absl::InvalidArgumentError(absl::StrCat("a contiguous file", kOnlyThese));
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "an entry of unknown type ", Quoted(std::string(1, entry.type)), kOnlyThese));
  }
}

// Rules 1 to 3: the entry on its own.
absl::StatusOr<CheckedEntry> Normalize(const TarEntry& entry) {
  CheckedEntry checked;
  GRADHUB_ASSIGN_OR_RETURN(checked.kind, KindOf(entry));
  GRADHUB_ASSIGN_OR_RETURN(checked.components, SplitName(entry.name));
  if (checked.components.empty() && checked.kind != EntryKind::kDirectory) {
    return absl::InvalidArgumentError("names the archive's root, which is a directory");
  }
  if (checked.kind != EntryKind::kFile && entry.size != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("a directory or link with %d bytes of data", entry.size));
  }
  if (checked.kind == EntryKind::kSymlink) {
    GRADHUB_RETURN_IF_ERROR(CheckLinkTarget(entry.link_target, checked.components.size() - 1));
    checked.link_target = entry.link_target;
  }
  checked.size = entry.size;
  checked.executable = checked.kind == EntryKind::kFile && (entry.mode & 0111) != 0;
  return checked;
}

}  // namespace

std::string ArchiveBytesOverLimit(int64_t bytes, int64_t limit) {
  return BytesOverLimit(bytes, limit, "archive", "--max-code-bytes");
}

std::string ArchiveOverLimit(int64_t limit) {
  return absl::StrFormat("the archive is over the limit of %s (--max-code-bytes)", SizeText(limit));
}

std::string UnpackedBytesOverLimit(int64_t bytes, int64_t limit) {
  return BytesOverLimit(bytes, limit, "files", "--max-code-unpacked-bytes");
}

std::string EntriesOverLimit(int64_t entries, int64_t limit) {
  return absl::StrFormat("%d entries are over the limit of %d (--max-code-entries)", entries,
                         limit);
}

absl::StatusOr<CheckedEntry> EntryRules::Check(const TarEntry& entry) {
  absl::StatusOr<CheckedEntry> checked = Normalize(entry);
  absl::Status status = checked.status();
  if (status.ok()) status = AddToTree(*checked);
  if (!status.ok()) return EntryError(entry.name, status.message());
  return checked;
}

absl::Status EntryRules::AddToTree(const CheckedEntry& entry) {
  if (entry.components.empty()) return absl::OkStatus();  // the root, always there
  int32_t folder = 0;
  GRADHUB_RETURN_IF_ERROR(AddFolders(entry.components, &folder));
  const Node kind = entry.kind == EntryKind::kDirectory ? Node::kDirectory
                    : entry.kind == EntryKind::kFile    ? Node::kFile
                                                        : Node::kSymlink;
  const auto [node, added] = FindOrAdd(folder, entry.components.back(), kind);
  if (!added) {
    if (node->kind != Node::kImplicitDirectory || kind != Node::kDirectory) {
      return absl::InvalidArgumentError(
          absl::StrCat("a second entry at ", Quoted(absl::StrJoin(entry.components, "/"))));
    }
    node->kind = Node::kDirectory;  // the explicit entry of a folder already seen
  }
  if (tree_.size() > static_cast<size_t>(limits_.max_entries)) {
    return absl::InvalidArgumentError(EntriesOverLimit(tree_.size(), limits_.max_entries));
  }
  if (entry.kind == EntryKind::kFile) {
    if (entry.size > limits_.max_unpacked_bytes - unpacked_bytes_) {
      const int64_t total = entry.size > std::numeric_limits<int64_t>::max() - unpacked_bytes_
                                ? std::numeric_limits<int64_t>::max()
                                : unpacked_bytes_ + entry.size;
      return absl::InvalidArgumentError(UnpackedBytesOverLimit(total, limits_.max_unpacked_bytes));
    }
    unpacked_bytes_ += entry.size;
  }
  return absl::OkStatus();
}

// The folders above the entry must be directories, explicit or implicit (added here);
// `folder` ends as the id of the entry's own folder.
absl::Status EntryRules::AddFolders(const std::vector<std::string>& components, int32_t* folder) {
  for (size_t i = 0; i + 1 < components.size(); ++i) {
    const auto [node, added] = FindOrAdd(*folder, components[i], Node::kImplicitDirectory);
    if (!added && (node->kind == Node::kFile || node->kind == Node::kSymlink)) {
      const std::string path = absl::StrJoin(components.begin(), components.begin() + i + 1, "/");
      return absl::InvalidArgumentError(absl::StrCat(
          "under ", Quoted(path), ", which is ", node->kind == Node::kFile ? "a file" : "a link"));
    }
    *folder = node->id;
  }
  return absl::OkStatus();
}

std::pair<EntryRules::TreeNode*, bool> EntryRules::FindOrAdd(int32_t folder,
                                                             const std::string& name, Node kind) {
  std::string key(sizeof(folder), '\0');
  std::memcpy(key.data(), &folder, sizeof(folder));
  key += name;
  const int32_t id = static_cast<int32_t>(tree_.size()) + 1;
  const auto [it, added] = tree_.try_emplace(std::move(key), TreeNode{id, kind});
  return {&it->second, added};
}

}  // namespace gradhub::code
