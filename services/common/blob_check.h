#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "services/common/background_sha256.h"
#include "services/common/sha256.h"

namespace gradhub {

// How a client checks a checkpoint's bytes end to end (checkpoint.proto, Checkpoint.crc32c):
// against the CRC-32C the store recorded where that CRC is of the bytes the sha256 names, else
// against the sha256. The CRC runs at about 19 GB/s on one core here, SHA-256 at 1.5, which was
// most of a download's CPU. Both detect corruption (on the wire, on a disk, in a cache); the
// CRC detects no forgery, and needs not: a checkpoint is only ever read by its own job, and the
// store's scrub checks the sha256 of what it holds.
//
// Pieces come in order from one thread at a time. Without a CRC the SHA-256 runs on a thread of
// its own (BackgroundSha256) while the next pieces arrive; with one, on the caller's.
class BlobCheck {
 public:
  // `crc32c`: Checkpoint.crc32c, or a download's first message's; none where it has none.
  BlobCheck(std::string sha256, std::optional<uint32_t> crc32c);

  // Takes the next piece. Where its bytes must outlive the call (the SHA-256, on its thread)
  // *piece is moved from; with a CRC it is left as it was, so that a caller reading into the
  // same string again (a protobuf message) reuses its memory: a fresh 1 MiB string per chunk
  // cost a download more in page faults than the CRC itself.
  void Update(std::string* piece);
  // Whether everything given so far is the blob: waits for the SHA-256's thread.
  bool Matches();
  // What Matches compares with, for messages: "crc32c 0a1b2c3d" or "sha256 <64 hex>".
  std::string Expected() const;

 private:
  const std::string sha256_;
  const std::optional<uint32_t> crc32c_;
  uint32_t crc32c_so_far_ = 0;
  std::unique_ptr<BackgroundSha256> sha_;  // only without a crc32c
};

// The digests of bytes given in order: a CRC-32C and, when asked for, a SHA-256 (the store's
// reads). Not thread-safe.
struct BlobDigests {
  uint32_t crc32c = 0;
  std::string sha256;  // lowercase hex; empty when not asked for
};
class BlobDigester {
 public:
  explicit BlobDigester(bool sha256) : sha256_(sha256) {}
  void Update(std::string_view data);
  // Of everything given so far; Update may continue afterwards.
  BlobDigests Digests() const;

 private:
  const bool sha256_;
  uint32_t crc32c_ = 0;
  Sha256Stream sha_;
};

// BlobCheck over `bytes` at once (a cached copy), on the caller's thread.
bool BlobMatches(std::string_view bytes, const std::string& sha256, std::optional<uint32_t> crc32c);

}  // namespace gradhub
