#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "services/common/ordered_worker.h"
#include "services/common/sha256.h"

namespace gradhub {

// SHA-256 over chunks handed over in order, computed on a thread of its own (an
// OrderedWorker), so that whoever receives the bytes (an upload stream) goes on receiving and
// writing while earlier chunks are hashed. SHA-256 runs at about the speed of a disk (1.5 GB/s
// with SHA-NI here), so hashing on the receiving thread would make every upload pay for both,
// one after the other. Hex() waits for the chunks queued before it. Calls come from one thread
// at a time; OpenSSL failures throw std::runtime_error on the hashing thread, which ends the
// process, as Sha256Stream's contract allows.
class BackgroundSha256 {
 public:
  explicit BackgroundSha256(size_t max_queued_bytes = 8 << 20) : worker_(max_queued_bytes) {}

  // Hashes chunk->substr(from) after everything given before.
  void Update(std::shared_ptr<const std::string> chunk, size_t from = 0);
  std::string Hex();

 private:
  Sha256Stream sha_;      // touched by the worker's thread, and by Hex() after a Drain
  OrderedWorker worker_;  // declared last: destroyed (drained and joined) first
};

}  // namespace gradhub
