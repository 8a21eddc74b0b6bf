// Code archives of script jobs (proto/gradhub/v1/code.proto): a user's directory packed into a
// tar, the same tar checked as it streams into gradhub-checkpoint, and unpacked on a node for
// each attempt. One set of rules on both sides, so what packs is what the store accepts, and
// what an agent unpacks is checked again whatever the store said.
//
// The format. A POSIX ustar archive; a pax extended header ('x') carries a path or a link
// target that does not fit ustar's fields (over 100 bytes, or not ASCII). PackDirectory writes
// it deterministically (sorted paths, mtime 0, owners 0 and unnamed, modes 0755/0644), so the
// same tree gives the same bytes, the same sha256, and is stored once. Readers also accept
// what GNU tar and Python's tarfile write: pax ('x' path/linkpath/size; 'g' global headers
// skipped), GNU long names ('L', 'K'), GNU base-256 sizes, names split into ustar's prefix.
//
// The entry rules (ArchiveChecker, UnpackArchive; PackDirectory refuses the same on disk). The
// first bad entry ends the check with INVALID_ARGUMENT `archive entry "<name>": <why>`:
//   1. Names: not empty, not absolute, no ".." component, valid UTF-8 without control
//      characters (C0, DEL, C1), at most 4095 bytes with components of at most 255. "." and
//      empty components are dropped ("./a//b" is "a/b"); "./" alone is the root and skipped.
//   2. Types: regular files, directories and symbolic links only. Hard links, character and
//      block devices, FIFOs, contiguous files, sparse files and unknown types are refused.
//      Directories and links carry no data.
//   3. Links: the target is relative and valid UTF-8, its ".." components all come first and
//      climb no higher than the archive's root from the link's folder ("../lib/x.py" in
//      "src/" is fine; "a/../b" is refused, because through a link "a", ".." leaves the
//      link's target rather than "a": with this rule no chain of links reaches out of the tree).
//   4. The tree: no path twice (a directory's explicit entry after files inside it is fine),
//      nothing under a path that is a file or a link (so no entry is ever reached through a
//      link). Directories may be implicit: "a/b.py" without an "a/" entry.
//   5. Limits (ArchiveLimits): the archive's bytes, the files' bytes, the entries. Entries
//      are the tree's paths: files, links and directories, implicit ones included.
//   6. The stream: every header's checksum, no truncated data, and the end marker (two zero
//      blocks); whatever follows the end marker is ignored.
//
// .gradhubignore (PackDirectory): `dir`/.gradhubignore, only at the top, holds one pattern a
// line, gitignore's syntax reduced to this subset:
//   - blank lines and lines starting with "#" are skipped; trailing spaces are dropped;
//   - "*" matches any run of characters but "/", "?" any one character but "/";
//   - "**" as a whole component matches any number of folders ("**/x", "a/**/x"); a trailing
//     "/**" matches everything inside ("build/**");
//   - a trailing "/" matches directories only;
//   - a pattern with a "/" at its start or inside is anchored to `dir`; one without matches
//     a name at any depth;
//   - "!" at the start re-includes what an earlier pattern excluded; the last pattern that
//     matches decides;
//   - an excluded directory is not descended, so nothing inside it can be re-included.
// Character classes ("[...]") and backslash escapes are refused naming the line. Nothing is
// excluded implicitly: not .git, not .gradhubignore itself; write them in the file.
//
// Thread-safety: the functions are reentrant; an ArchiveChecker is used by one thread at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace gradhub::code {

struct ArchiveLimits {
  int64_t max_archive_bytes = int64_t{256} << 20;  // the tar's own size (--max-code-bytes)
  int64_t max_unpacked_bytes = int64_t{1}
                               << 30;  // regular files' sizes (--max-code-unpacked-bytes)
  int32_t max_entries = 100000;        // files + directories + links (--max-code-entries)
};

struct ArchiveSummary {
  int64_t archive_bytes = 0;
  int64_t unpacked_bytes = 0;
  int32_t entries = 0;
};

// Packs `dir` into a tar written at `archive_path` (created or truncated). Entries in byte-wise
// sorted path order, mtime 0, uid/gid 0, uname/gname empty, mode 0755 for directories and
// executables (any x bit), 0644 for other files, 0777 for links; `dir` itself is no entry.
// Skips what `dir`/.gradhubignore excludes. Symlinks are packed as links (never followed) when
// their target keeps to rule 3 above.
// INVALID_ARGUMENT naming the path (relative to `dir`) for: a device, FIFO or socket; a link
// that rule 3 refuses; a name that rule 1 refuses; the archive file itself inside `dir`; a bad
// .gradhubignore line. INVALID_ARGUMENT naming the limit and its value when the tree, measured
// before anything is written, is over a limit:
//   "code: 300 MiB of archive is over the limit of 256 MiB (--max-code-bytes)".
// NOT_FOUND if `dir` is missing. On error the archive file is removed.
absl::StatusOr<ArchiveSummary> PackDirectory(const std::string& dir,
                                             const std::string& archive_path,
                                             const ArchiveLimits& limits = {});

// The same archive's bytes, in order, to `sink` (about 4 MiB a call) instead of a file: for a
// client that hashes or uploads them as they come, without a temporary copy. The first error
// `sink` returns ends the packing and is returned. The same refusals as PackDirectory.
using ArchiveSink = std::function<absl::Status(std::string_view bytes)>;
absl::StatusOr<ArchiveSummary> PackDirectoryTo(const std::string& dir, const ArchiveSink& sink,
                                               const ArchiveLimits& limits = {});

// Checks a tar as it streams in: the code store feeds it upload chunks, in any split of the
// bytes (down to one byte at a time; the result is the same). The first bad entry ends it
// with INVALID_ARGUMENT `archive entry "../x": ...` (the rules above); every later Feed or
// Finish returns that error again. Not thread-safe.
class ArchiveChecker {
 public:
  explicit ArchiveChecker(ArchiveLimits limits = {});
  ~ArchiveChecker();
  ArchiveChecker(ArchiveChecker&&) noexcept;
  ArchiveChecker& operator=(ArchiveChecker&&) noexcept;

  absl::Status Feed(std::string_view bytes);
  // After the last Feed: the summary, or the error (a missing end marker, truncated data).
  absl::StatusOr<ArchiveSummary> Finish();

 private:
  class State;
  std::unique_ptr<State> state_;
};

// The whole file through an ArchiveChecker. NOT_FOUND if it is missing.
absl::StatusOr<ArchiveSummary> CheckArchiveFile(const std::string& archive_path,
                                                const ArchiveLimits& limits = {});

// Unpacks into `dest_dir`, which must not exist yet (ALREADY_EXISTS otherwise; it is created,
// 0755), checking every entry again with the same rules: it never trusts that the archive was
// checked before. Files are 0755 when packed with any x bit, else 0644 (never setuid, setgid
// or sticky, whatever the header says); directories 0755; links as links.
// Nothing is written outside dest_dir:
//   1. the rules already refuse every name that climbs, and every entry under a link;
//   2. and every path is walked from dest_dir's descriptor, one component at a time, with
//      O_NOFOLLOW | O_DIRECTORY, and created with mkdirat / openat(O_CREAT | O_EXCL |
//      O_NOFOLLOW) / symlinkat relative to it: a link met on the way is an error, not a jump.
// On error dest_dir and everything in it are removed.
absl::StatusOr<ArchiveSummary> UnpackArchive(const std::string& archive_path,
                                             const std::string& dest_dir,
                                             const ArchiveLimits& limits = {});

}  // namespace gradhub::code
