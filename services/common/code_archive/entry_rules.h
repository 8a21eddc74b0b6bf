// EntryRules: rules 1 to 5 of code_archive.h over the entries of one archive, in their order:
// what each entry is, where it lands in the tree, and what the tree adds up to. Not
// thread-safe; one per archive.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "services/common/code_archive/code_archive.h"
#include "services/common/code_archive/tar_reader.h"

namespace gradhub::code {

enum class EntryKind { kDirectory, kFile, kSymlink };

// An entry that passed the rules, its name split and cleaned.
struct CheckedEntry {
  std::vector<std::string> components;  // empty: the root directory ("./"), nothing to do
  EntryKind kind = EntryKind::kFile;
  bool executable = false;  // a file with any x bit: unpacked 0755, else 0644
  int64_t size = 0;
  std::string link_target;  // kSymlink
};

// The reasons a limit gives, shared by the packer and the checks:
// "300 MiB of archive is over the limit of 256 MiB (--max-code-bytes)".
std::string ArchiveBytesOverLimit(int64_t bytes, int64_t limit);
// A stream knows only that it read past the limit: "the archive is over the limit of ...".
std::string ArchiveOverLimit(int64_t limit);
std::string UnpackedBytesOverLimit(int64_t bytes, int64_t limit);
std::string EntriesOverLimit(int64_t entries, int64_t limit);

class EntryRules {
 public:
  explicit EntryRules(const ArchiveLimits& limits) : limits_(limits) {}

  // The entry, checked against everything before it; INVALID_ARGUMENT naming it otherwise.
  absl::StatusOr<CheckedEntry> Check(const TarEntry& entry);

  int64_t unpacked_bytes() const { return unpacked_bytes_; }
  int32_t entries() const { return static_cast<int32_t>(tree_.size()); }

 private:
  enum class Node { kImplicitDirectory, kDirectory, kFile, kSymlink };

  struct TreeNode {
    int32_t id;  // the folder id of what lies inside it; the root's is 0
    Node kind;
  };

  // Rule 4 and 5: the entry's folders (implicit ones added) and its own node.
  absl::Status AddToTree(const CheckedEntry& entry);
  absl::Status AddFolders(const std::vector<std::string>& components, int32_t* folder);
  // The node `name` in the folder `folder`, added as `kind` if missing (then `added`).
  std::pair<TreeNode*, bool> FindOrAdd(int32_t folder, const std::string& name, Node kind);

  const ArchiveLimits limits_;
  // Every path seen, as (its folder's id, its name): the memory grows with the names, not
  // with whole paths, which a hostile archive could make 4 KiB long for every folder of every
  // entry. Key: the folder id's 4 bytes, then the name.
  absl::flat_hash_map<std::string, TreeNode> tree_;
  int64_t unpacked_bytes_ = 0;
};

}  // namespace gradhub::code
