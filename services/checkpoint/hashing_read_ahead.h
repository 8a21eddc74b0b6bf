// Reads a blob ahead on a thread of its own and hashes it there, so that a download sends one
// chunk while the next ones are read from disk and hashed, instead of reading, hashing and
// sending in turn on one thread:
//   1. the thread reads chunks of at most `chunk_bytes` from the reader's position, adds each
//      to a SHA-256 and queues it; it waits while `max_queued_bytes` are queued;
//   2. once it has read `size` bytes (the whole blob), the hash is final before the last chunk
//      is queued, so whoever takes the last chunk can ask for Sha256Hex() at once;
//   3. a failed read ends the queue: Next() hands out the chunks read before it, then the
//      error. A read that finds the blob shorter than `size` ends it the same way with
//      DATA_LOSS ("ended early").
// Destroying it stops the thread after the read in progress.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "services/checkpoint/blob_store.h"
#include "services/common/sha256.h"

namespace gradhub::checkpoint {

class HashingReadAhead {
 public:
  static constexpr size_t kQueuedBytes = 8 << 20;

  // `reader` must be at offset 0 when the hash is to cover the whole blob.
  HashingReadAhead(std::unique_ptr<BlobReader> reader, int64_t size, size_t chunk_bytes,
                   size_t max_queued_bytes = kQueuedBytes);
  ~HashingReadAhead();
  HashingReadAhead(const HashingReadAhead&) = delete;
  HashingReadAhead& operator=(const HashingReadAhead&) = delete;

  // The next chunk into *data, in order; empty once all `size` bytes were handed out.
  absl::Status Next(std::string* data);
  // Lowercase hex SHA-256 of the `size` bytes, once the thread has hashed them all (at once
  // after Next handed out the last chunk); empty when the thread stopped early.
  std::string Sha256Hex();

 private:
  void ReadAll();

  const std::unique_ptr<BlobReader> reader_;
  const int64_t size_;
  const size_t chunk_bytes_;
  const size_t max_queued_bytes_;
  Sha256Stream sha_;  // the thread's until it is done

  std::mutex mu_;
  std::condition_variable changed_;
  std::deque<std::string> queue_;  // guarded by mu_
  size_t queued_bytes_ = 0;        // guarded by mu_
  bool done_ = false;              // guarded by mu_: the thread read everything, or failed
  absl::Status error_;             // guarded by mu_: why it stopped early
  std::string hex_;                // guarded by mu_: set before the last chunk is queued
  bool stopping_ = false;          // guarded by mu_
  std::thread thread_;             // declared last: started once the rest is built
};

}  // namespace gradhub::checkpoint
