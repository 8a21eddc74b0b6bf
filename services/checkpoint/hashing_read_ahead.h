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
#include <string_view>
#include <thread>

#include "absl/status/status.h"
#include "services/checkpoint/blob_store.h"
#include "services/common/blob_check.h"
#include "services/common/ordered_worker.h"

namespace gradhub::checkpoint {

struct ReadAheadOptions {
  // Besides the CRC-32C (about 19 GB/s on one core here), also a SHA-256 (about 1.3 GB/s).
  bool sha256 = true;
  size_t max_queued_bytes = 8 << 20;
};

// The hand-off from the hashing thread to whoever takes the chunks (steps 2 to 4 above): chunks
// in order, at most `max_queued_bytes` of them (one chunk always fits), then the end (OK or why
// the blob could not be read to its end), and the blob's digests once known.
// Thread-safe; Push, SetDigests and Close come from the producer, Pop and Digests from the
// consumer, Stop from whoever gives up on the rest.
class ReadAheadQueue {
 public:
  explicit ReadAheadQueue(size_t max_queued_bytes) : max_queued_bytes_(max_queued_bytes) {}

  // Waits until fewer than `max_queued_bytes` are queued, then sets `digests` (when given:
  // those of the whole blob, with its last chunk) and queues `chunk`, so that the digests are
  // known before the last chunk can be taken. False, with nothing queued, once stopped.
  bool Push(std::string chunk, std::optional<BlobDigests> digests);
  // The digests of a blob that has no chunk.
  void SetDigests(BlobDigests digests);
  // No chunk follows: Pop returns `status` once the queue is empty. Wakes Digests() waiters.
  void Close(absl::Status status);
  // The consumer is gone: ends every wait of Push, which queues nothing more.
  void Stop();
  bool stopped();

  // The next chunk into *data; once closed and empty, `data` empty and Close's status.
  absl::Status Pop(std::string* data);
  // Waits for the digests or the close; nullopt when it closed without them.
  std::optional<BlobDigests> Digests();

 private:
  const size_t max_queued_bytes_;
  std::mutex mu_;
  std::condition_variable changed_;
  std::deque<std::string> chunks_;      // guarded by mu_
  size_t queued_bytes_ = 0;             // guarded by mu_
  bool closed_ = false;                 // guarded by mu_: no chunk follows
  absl::Status error_;                  // guarded by mu_: Close's status
  std::optional<BlobDigests> digests_;  // guarded by mu_
  bool stopped_ = false;                // guarded by mu_
};

// Next and Digests may be called from any thread (a download calls them from one).
class HashingReadAhead {
 public:
  // `reader` must be at offset 0 when the digests are to cover the whole blob.
  HashingReadAhead(std::unique_ptr<BlobReader> reader, int64_t size, size_t chunk_bytes,
                   ReadAheadOptions options = {});
  ~HashingReadAhead();
  HashingReadAhead(const HashingReadAhead&) = delete;
  HashingReadAhead& operator=(const HashingReadAhead&) = delete;

  // The next chunk into *data, in order; empty once all `size` bytes were handed out.
  absl::Status Next(std::string* data) { return queue_.Pop(data); }
  // The digests of the `size` bytes, once the thread has checked them all (at once after Next
  // handed out the last chunk); nullopt when the threads stopped early.
  std::optional<BlobDigests> Digests() { return queue_.Digests(); }

 private:
  // Step 1 and 4, on the reading thread.
  void ReadAll();
  // Steps 2 and 3, on the hashing thread.
  void HashAndQueue(std::string chunk, bool last);

  const std::unique_ptr<BlobReader> reader_;
  const int64_t size_;
  const size_t chunk_bytes_;
  BlobDigester digester_;  // the hashing thread's
  ReadAheadQueue queue_;
  OrderedWorker hasher_;  // its tasks use the members above: destroyed before them
  std::thread thread_;    // declared last: started once the rest is built
};

}  // namespace gradhub::checkpoint
