// Reads a blob ahead and checksums it, so that a download sends one chunk while the next ones
// are read from disk and checked, instead of reading, checking and sending in turn on one
// thread. Reading and checking overlap too, each on a thread of its own (a direct read of 1 MiB
// and its SHA-256 take about as long):
//   1. the reading thread reads chunks of at most `chunk_bytes` from the reader's position and
//      hands each to the hashing thread, at most two chunks ahead of it;
//   2. the hashing thread adds each chunk to a CRC-32C and, when asked for, a SHA-256, in
//      order, and queues it; it waits while `max_queued_bytes` are queued;
//   3. the digests are final before the last chunk (the blob's `size` bytes in all) is queued,
//      so whoever takes the last chunk can ask for Digests() at once;
//   4. a failed read ends the queue once the chunks before it are queued: Next() hands those
//      out, then the error. A read that finds the blob shorter than `size` ends it the same
//      way with DATA_LOSS ("ended early").
// Destroying it stops both threads after the read in progress.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "services/checkpoint/blob_store.h"
#include "services/common/ordered_worker.h"
#include "services/common/sha256.h"

namespace gradhub::checkpoint {

struct BlobDigests {
  uint32_t crc32c = 0;
  std::string sha256;  // lowercase hex; empty when not asked for
};

struct ReadAheadOptions {
  // Besides the CRC-32C (about 19 GB/s on one core here), also a SHA-256 (about 1.3 GB/s).
  bool sha256 = true;
  size_t max_queued_bytes = 8 << 20;
};

class HashingReadAhead {
 public:
  // `reader` must be at offset 0 when the digests are to cover the whole blob.
  HashingReadAhead(std::unique_ptr<BlobReader> reader, int64_t size, size_t chunk_bytes,
                   ReadAheadOptions options = {});
  ~HashingReadAhead();
  HashingReadAhead(const HashingReadAhead&) = delete;
  HashingReadAhead& operator=(const HashingReadAhead&) = delete;

  // The next chunk into *data, in order; empty once all `size` bytes were handed out.
  absl::Status Next(std::string* data);
  // The digests of the `size` bytes, once the thread has checked them all (at once after Next
  // handed out the last chunk); nullopt when the threads stopped early.
  std::optional<BlobDigests> Digests();

 private:
  void ReadAll();
  // Steps 2 and 3, on the hashing thread.
  void HashAndQueue(std::string chunk, bool last);
  bool Stopping();

  const std::unique_ptr<BlobReader> reader_;
  const int64_t size_;
  const size_t chunk_bytes_;
  const ReadAheadOptions options_;
  // The hashing thread's until it is done.
  uint32_t crc32c_ = 0;
  Sha256Stream sha_;

  std::mutex mu_;
  std::condition_variable changed_;
  std::deque<std::string> queue_;       // guarded by mu_
  size_t queued_bytes_ = 0;             // guarded by mu_
  bool done_ = false;                   // guarded by mu_: the thread read everything, or failed
  absl::Status error_;                  // guarded by mu_: why it stopped early
  std::optional<BlobDigests> digests_;  // guarded by mu_: set before the last chunk is queued
  bool stopping_ = false;               // guarded by mu_
  OrderedWorker hasher_;                // its tasks use the members above: destroyed before them
  std::thread thread_;                  // declared last: started once the rest is built
};

}  // namespace gradhub::checkpoint
