// A checkpoint's bytes, in memory or in a file, and the scratch files that keep large ones out
// of a rank's memory.
//
// Why files: a pipeline stage's state is its share of the parameters and the optimizer's
// state. A copy of it in memory (serialized, gathered on rank 0, uploaded) needs about as much
// memory again as training the stage does, and a rank's limit (--memory-per-slot) is sized for
// training: the point of pipeline stages is a model that does not fit one slot. A file's
// pages are page cache instead. The rank's memory cgroup is charged for them too, but the
// kernel reclaims clean ones under the limit instead of killing the rank, and ScratchFile
// writes them back and drops them as it goes, so they never pile up. So a stage's state is
// written to a file, mapped read-only to be sent or uploaded, and read back from a mapping.
//
// No torch and no gRPC: the trainer, the checkpoint client and the format's tests share it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace gradhub::trainer {

// Immutable bytes: a string, or a file mapped read-only, or a part of either. Copies share the
// storage (cheap; thread-safe to read from several threads). A mapping outlives the file's
// name: the file may be removed (or was never named: ScratchFile) while its bytes are read.
class CheckpointBytes {
 public:
  CheckpointBytes() = default;
  // Implicit: bytes in memory are the common case (small checkpoints, tests).
  CheckpointBytes(std::string bytes);  // NOLINT(google-explicit-constructor)
  CheckpointBytes(const char* bytes) : CheckpointBytes(std::string(bytes)) {}  // NOLINT

  // The whole file at `path`, mapped read-only. Throws std::runtime_error naming the path.
  static CheckpointBytes MapFile(const std::string& path);

  std::string_view view() const { return view_; }
  size_t size() const { return view_.size(); }
  bool empty() const { return view_.empty(); }
  // Whether the bytes are a file's pages rather than the process's memory.
  bool mapped() const;
  // Bytes [offset, offset + size) of these, sharing their storage. Throws std::out_of_range
  // past the end.
  CheckpointBytes Slice(size_t offset, size_t size) const;

  // The string `bytes` are held in, emptied but with its memory, for the next checkpoint to be
  // written into: a fresh buffer of a checkpoint's size costs a page fault per 4 KiB page as it
  // is first written (a third of the snapshot of a 160 MiB state). Only when nothing else holds
  // these bytes, on any thread, and they are a string; else an empty string.
  static std::string Reclaim(CheckpointBytes bytes);

  explicit operator std::string_view() const { return view_; }
  bool operator==(std::string_view other) const { return view_ == other; }

  struct Storage;  // the string or the mapping (checkpoint_bytes.cc)

 private:
  CheckpointBytes(std::shared_ptr<const Storage> storage, std::string_view view)
      : storage_(std::move(storage)), view_(view) {}
  friend class ScratchFile;

  std::shared_ptr<const Storage> storage_;
  std::string_view view_;
};

// A file with no name, for bytes too large to hold in memory: created in a directory and
// unlinked at once, so nothing is left behind whatever ends the process. Written by appending,
// then mapped.
//
// Appending keeps the page cache it fills small (the protocol of a streaming writer):
//   1. every kWritebackBytes written, start the write-back of those bytes;
//   2. wait for the write-back of the block before them, which had a block's time to finish,
//      and drop its pages from the page cache.
// So at most two blocks are dirty or cached at a time, whatever the file's size.
// Not thread-safe.
class ScratchFile {
 public:
  static constexpr int64_t kWritebackBytes = int64_t{16} << 20;

  // Throws std::runtime_error naming `directory` ("" = the current one).
  explicit ScratchFile(const std::string& directory);
  ~ScratchFile();
  ScratchFile(const ScratchFile&) = delete;
  ScratchFile& operator=(const ScratchFile&) = delete;

  // Throws std::runtime_error (a full disk names the directory), or std::logic_error after Map.
  void Append(std::string_view bytes);
  // Replaces bytes [offset, offset + size) already appended (a header whose fields were known
  // only later). Throws as Append, and std::out_of_range past the end.
  void Overwrite(int64_t offset, std::string_view bytes);
  int64_t size() const { return size_; }
  // Everything appended, mapped read-only; the file lives as long as the result. Appending
  // ends here. Throws std::runtime_error.
  CheckpointBytes Map();

 private:
  void WriteAt(int64_t offset, std::string_view bytes);
  void WriteBack(int64_t end);

  std::string directory_;
  int fd_ = -1;
  int64_t size_ = 0;
  int64_t written_back_ = 0;  // the start of the block whose write-back is in flight
  bool mapped_ = false;
};

}  // namespace gradhub::trainer
