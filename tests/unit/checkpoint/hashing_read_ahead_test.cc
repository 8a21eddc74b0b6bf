// HashingReadAhead: chunks in order with the blob's digests (CRC-32C, SHA-256 when asked), read
// errors after the chunks before them, a short blob as DATA_LOSS, and no hang when the download
// stops early.
#include "services/checkpoint/hashing_read_ahead.h"

#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <string>

#include "services/common/crc32c.h"
#include "services/common/sha256.h"

namespace gradhub::checkpoint {
namespace {

// Serves `bytes`, then fails every read from `fail_at` on.
class MemoryReader final : public BlobReader {
 public:
  MemoryReader(std::string bytes, int64_t fail_at = -1)
      : bytes_(std::move(bytes)), fail_at_(fail_at) {}
  absl::Status Read(size_t max_bytes, std::string* out) override {
    if (fail_at_ >= 0 && position_ >= static_cast<size_t>(fail_at_)) {
      return absl::UnavailableError("the disk went away");
    }
    *out = bytes_.substr(position_, max_bytes);
    position_ += out->size();
    return absl::OkStatus();
  }
  int64_t size() const override { return static_cast<int64_t>(bytes_.size()); }

 private:
  std::string bytes_;
  size_t position_ = 0;
  int64_t fail_at_;
};

std::string Bytes(size_t size) {
  std::string bytes(size, '\0');
  for (size_t i = 0; i < size; ++i) bytes[i] = static_cast<char>(i * 31 + i / 251);
  return bytes;
}

TEST(HashingReadAheadTest, HandsOutEveryChunkInOrderAndTheHashOfAll) {
  const std::string blob = Bytes(100000);
  HashingReadAhead ahead(std::make_unique<MemoryReader>(blob), 100000, 4096,
                         {.max_queued_bytes = 3 * 4096});
  std::string all, chunk;
  do {
    ASSERT_TRUE(ahead.Next(&chunk).ok());
    EXPECT_LE(chunk.size(), 4096u);
    all += chunk;
  } while (!chunk.empty());
  EXPECT_TRUE(all == blob);
  const std::optional<BlobDigests> digests = ahead.Digests();
  ASSERT_TRUE(digests.has_value());
  EXPECT_EQ(digests->sha256, Sha256Hex(blob));
  EXPECT_EQ(digests->crc32c, Crc32c(blob));
}

TEST(HashingReadAheadTest, WithoutSha256OnlyTheCrc32cIsComputed) {
  const std::string blob = Bytes(50000);
  HashingReadAhead ahead(std::make_unique<MemoryReader>(blob), 50000, 4096, {.sha256 = false});
  std::string chunk;
  do {
    ASSERT_TRUE(ahead.Next(&chunk).ok());
  } while (!chunk.empty());
  const std::optional<BlobDigests> digests = ahead.Digests();
  ASSERT_TRUE(digests.has_value());
  EXPECT_EQ(digests->crc32c, Crc32c(blob));
  EXPECT_EQ(digests->sha256, "");
}

TEST(HashingReadAheadTest, AnEmptyBlobHasTheEmptyHash) {
  HashingReadAhead ahead(std::make_unique<MemoryReader>(""), 0, 4096, {.max_queued_bytes = 4096});
  std::string chunk = "x";
  EXPECT_TRUE(ahead.Next(&chunk).ok());
  EXPECT_TRUE(chunk.empty());
  ASSERT_TRUE(ahead.Digests().has_value());
  EXPECT_EQ(ahead.Digests()->sha256, Sha256Hex(""));
  EXPECT_EQ(ahead.Digests()->crc32c, 0u);
}

TEST(HashingReadAheadTest, AReadErrorComesAfterTheChunksReadBeforeIt) {
  HashingReadAhead ahead(std::make_unique<MemoryReader>(Bytes(10000), 8192), 10000, 4096,
                         {.max_queued_bytes = 4096});
  std::string chunk;
  EXPECT_TRUE(ahead.Next(&chunk).ok());
  EXPECT_TRUE(ahead.Next(&chunk).ok());
  EXPECT_EQ(chunk.size(), 4096u);
  EXPECT_TRUE(absl::IsUnavailable(ahead.Next(&chunk)));
  EXPECT_FALSE(ahead.Digests().has_value());  // never complete
}

TEST(HashingReadAheadTest, ABlobShorterThanItsSizeIsDataLoss) {
  HashingReadAhead ahead(std::make_unique<MemoryReader>(Bytes(5000)), 9000, 4096,
                         {.max_queued_bytes = 4096});
  std::string chunk;
  EXPECT_TRUE(ahead.Next(&chunk).ok());
  EXPECT_TRUE(ahead.Next(&chunk).ok());
  const absl::Status short_read = ahead.Next(&chunk);
  EXPECT_TRUE(absl::IsDataLoss(short_read)) << short_read;
  EXPECT_NE(short_read.message().find("ended early, at 5000 of 9000"), std::string::npos);
}

TEST(HashingReadAheadTest, StoppingBeforeTheEndDoesNotWaitForTheRest) {
  // The thread waits on a full queue; destroying it must end that wait.
  auto ahead =
      std::make_unique<HashingReadAhead>(std::make_unique<MemoryReader>(Bytes(1 << 20)), 1 << 20,
                                         4096, ReadAheadOptions{.max_queued_bytes = 4096});
  std::string chunk;
  ASSERT_TRUE(ahead->Next(&chunk).ok());
  ahead.reset();
}

}  // namespace
}  // namespace gradhub::checkpoint
