#pragma once

#include <cstddef>
#include <string>

#include "services/common/ordered_worker.h"
#include "services/common/sha256.h"

namespace gradhub {

// SHA-256 over pieces handed over in order, computed on a thread of its own (an OrderedWorker),
// so that a download's client goes on receiving while the pieces before are hashed. SHA-256
// runs at about the speed of the transfer (1.2-1.5 GB/s with SHA-NI here): on one thread a
// client pays for both, one after the other. Hex() waits for the pieces given before it; Update
// may go on afterwards. Calls come from one thread at a time. OpenSSL fails only when out of
// memory or misconfigured: that throws std::runtime_error on the hashing thread, which ends the
// process, as Sha256Stream's contract allows.
class BackgroundSha256 {
 public:
  // Update waits while pieces of more than `max_queued_bytes` wait to be hashed.
  explicit BackgroundSha256(size_t max_queued_bytes = 8 << 20) : worker_(max_queued_bytes) {}

  // Takes `piece`: hashed after everything given before.
  void Update(std::string piece);
  std::string Hex();

 private:
  Sha256Stream sha_;      // the worker's thread's, and Hex()'s after a Drain
  OrderedWorker worker_;  // declared last: destroyed (drained and joined) first
};

}  // namespace gradhub
