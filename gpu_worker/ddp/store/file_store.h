#pragma once

#include <optional>
#include <string>

#include "gpu_worker/ddp/store.h"

namespace gradhub::ddp {

// A Store shared by processes on one machine through a directory (torchrun's FileStore,
// gloo's rendezvous::FileStore): `gradhub-trainer --store file:/tmp/rdzv`.
//
// Layout: one file per key, named "k." + the key with every byte outside [A-Za-z0-9._-]
// percent-encoded, so a key with '/' is one file and no key ("..", "../x") names a path
// outside the directory. The "k." prefix also keeps "." and ".." from being taken as
// directory entries and leaves other names free for temp files and the lock file. Keys whose
// encoding exceeds the file system's NAME_MAX (255 bytes) fail with StoreError.
//
// Protocol:
//   1. Set writes a temp file in the directory and rename()s it over the key's file, so a
//      reader sees the old value or the new one, never a partial one.
//   2. Set, Add and DeletePrefix hold an exclusive flock() on "<dir>/.lock" for the whole
//      read-modify-write. Set takes it too so that it cannot slip between Add's read and write
//      and be lost.
//   3. Get, Wait and Check take no lock: thanks to (1) a file that exists is complete. They
//      poll, sleeping 1 ms and doubling up to 20 ms, until the key exists or time runs out.
//
// Thread-safe, and safe across processes (also across fork(): the lock file is opened anew by
// every operation, so no flock is shared through an inherited descriptor). A process that dies
// mid-Set leaves at most a stray temp file, which is ignored.
class FileStore : public Store {
 public:
  // Creates `dir` and its parents if missing; StoreError when it cannot.
  explicit FileStore(std::string dir);

  void Set(const std::string& key, const std::string& value) override;
  std::string Get(const std::string& key, std::chrono::milliseconds timeout) override;
  int64_t Add(const std::string& key, int64_t delta) override;
  void Wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  bool Check(const std::vector<std::string>& keys) override;
  int64_t DeletePrefix(const std::string& prefix) override;

  const std::string& dir() const { return dir_; }

 private:
  std::string PathOf(const std::string& key) const;
  // The value of `key`, or nullopt when it is not set.
  std::optional<std::string> Read(const std::string& key) const;
  bool Exists(const std::string& key) const;
  // Replaces the file at `path` through a temp file and rename(). Caller holds the lock.
  void WriteLocked(const std::string& path, const std::string& value);

  std::string dir_;
};

}  // namespace gradhub::ddp
