// Fuzzes the code archive reader (services/common/code_archive/code_archive.h) with the bytes a
// tenant uploads: ArchiveChecker as gradhub-checkpoint runs it on a stream, and UnpackArchive
// as an agent runs it, into a fresh directory removed after each input. The production limits
// (ArchiveLimits' defaults) hold; an input is far below --max-code-bytes.
// Checked besides "never crashes":
//   1. the checker's result does not depend on how the bytes are split into Feed calls;
//   2. UnpackArchive never accepts what the checker refuses;
//   3. nothing is written beside the destination directory (the scratch directory holds only
//      the input's file afterwards, and the destination is gone once removed or refused).
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

#include "services/common/code_archive/code_archive.h"

namespace {

namespace fs = std::filesystem;
using gradhub::code::ArchiveChecker;
using gradhub::code::ArchiveSummary;

void Require(bool condition) {
  if (!condition) std::abort();
}

// The scratch directory of this process, made once and removed at exit.
const fs::path& Scratch() {
  static const fs::path dir = [] {
    std::string pattern = (fs::temp_directory_path() / "gradhub-fuzz-archive-XXXXXX").string();
    Require(mkdtemp(pattern.data()) != nullptr);
    std::atexit([] { fs::remove_all(Scratch()); });
    return fs::path(pattern);
  }();
  return dir;
}

absl::StatusOr<ArchiveSummary> CheckInChunks(std::string_view bytes, size_t chunk) {
  ArchiveChecker checker;
  for (size_t at = 0; at < bytes.size(); at += chunk) {
    if (!checker.Feed(bytes.substr(at, chunk)).ok()) break;
  }
  return checker.Finish();
}

bool SameResult(const absl::StatusOr<ArchiveSummary>& a, const absl::StatusOr<ArchiveSummary>& b) {
  if (a.ok() != b.ok()) return false;
  if (!a.ok()) return a.status() == b.status();
  return a->archive_bytes == b->archive_bytes && a->unpacked_bytes == b->unpacked_bytes &&
         a->entries == b->entries;
}

// Unpacks `bytes` into a fresh directory and removes it; whether the unpack succeeded.
bool UnpackAndRemove(std::string_view bytes) {
  const fs::path archive = Scratch() / "in.tar";
  const fs::path dest = Scratch() / "out";
  {
    std::ofstream out(archive, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    Require(out.good());
  }
  const bool ok = gradhub::code::UnpackArchive(archive.string(), dest.string()).ok();
  Require(ok || !fs::exists(fs::symlink_status(dest)));
  fs::remove_all(dest);
  int others = 0;
  for (const fs::directory_entry& entry : fs::directory_iterator(Scratch())) {
    others += entry.path() != archive;
  }
  Require(others == 0);
  fs::remove(archive);
  return ok;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  const absl::StatusOr<ArchiveSummary> whole = CheckInChunks(bytes, size == 0 ? 1 : size);
  Require(SameResult(whole, CheckInChunks(bytes, size % 509 + 1)));
  const bool unpacked = UnpackAndRemove(bytes);
  Require(whole.ok() || !unpacked);
  return 0;
}
