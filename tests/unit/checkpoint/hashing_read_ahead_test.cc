// HashingReadAhead: chunks in order with the blob's digests (CRC-32C, SHA-256 when asked), read
// errors after the chunks before them, a short blob as DATA_LOSS, and no hang when the download
// stops early. Its parts alone: BlobDigester (digests of pieces = digests of the whole) and
// ReadAheadQueue (bounded, digests before the last chunk, the end after the chunks, Stop).
#include "services/checkpoint/hashing_read_ahead.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <thread>

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

TEST(BlobDigesterTest, PiecesHaveTheDigestsOfTheWhole) {
  const std::string blob = Bytes(10000);
  BlobDigester digester(/*sha256=*/true);
  EXPECT_EQ(digester.Digests().sha256, Sha256Hex(""));
  digester.Update(std::string_view(blob).substr(0, 3000));
  EXPECT_EQ(digester.Digests().crc32c, Crc32c(blob.substr(0, 3000)));  // and it goes on
  digester.Update(std::string_view(blob).substr(3000));
  EXPECT_EQ(digester.Digests().crc32c, Crc32c(blob));
  EXPECT_EQ(digester.Digests().sha256, Sha256Hex(blob));
}

TEST(BlobDigesterTest, WithoutSha256TheShaIsEmpty) {
  BlobDigester digester(/*sha256=*/false);
  digester.Update("abc");
  EXPECT_EQ(digester.Digests().crc32c, Crc32c("abc"));
  EXPECT_EQ(digester.Digests().sha256, "");
}

TEST(ReadAheadQueueTest, ChunksInOrderThenTheStatusItClosedWith) {
  ReadAheadQueue queue(1 << 20);
  ASSERT_TRUE(queue.Push("ab", std::nullopt));
  ASSERT_TRUE(queue.Push("cd", std::nullopt));
  queue.Close(absl::UnavailableError("the disk went away"));
  std::string chunk;
  EXPECT_TRUE(queue.Pop(&chunk).ok());
  EXPECT_EQ(chunk, "ab");
  EXPECT_TRUE(queue.Pop(&chunk).ok());
  EXPECT_EQ(chunk, "cd");
  EXPECT_TRUE(absl::IsUnavailable(queue.Pop(&chunk)));
  EXPECT_EQ(chunk, "");
  EXPECT_FALSE(queue.Digests().has_value());  // closed without them: no wait
}

TEST(ReadAheadQueueTest, TheDigestsAreKnownBeforeTheLastChunkCanBeTaken) {
  ReadAheadQueue queue(1 << 20);
  ASSERT_TRUE(queue.Push("last", BlobDigests{7, "s"}));
  std::string chunk;
  ASSERT_TRUE(queue.Pop(&chunk).ok());
  const std::optional<BlobDigests> digests = queue.Digests();  // not closed: must not wait
  ASSERT_TRUE(digests.has_value());
  EXPECT_EQ(digests->crc32c, 7u);
  EXPECT_EQ(digests->sha256, "s");
}

TEST(ReadAheadQueueTest, PushWaitsForRoomAndStopEndsTheWait) {
  ReadAheadQueue queue(4);
  ASSERT_TRUE(queue.Push("12345", std::nullopt));  // one chunk always fits
  std::atomic<bool> returned{false};
  bool pushed = true;
  std::thread producer([&] {
    pushed = queue.Push("6", std::nullopt);
    returned = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(returned.load());  // the queue is full
  queue.Stop();
  producer.join();
  EXPECT_FALSE(pushed);
  EXPECT_TRUE(queue.stopped());
}

TEST(ReadAheadQueueTest, TakingAChunkMakesRoomForTheNext) {
  ReadAheadQueue queue(4);
  ASSERT_TRUE(queue.Push("12345", std::nullopt));
  bool pushed = false;
  std::thread producer([&] { pushed = queue.Push("6", std::nullopt); });
  std::string chunk;
  ASSERT_TRUE(queue.Pop(&chunk).ok());
  ASSERT_TRUE(queue.Pop(&chunk).ok());  // waits for the producer
  EXPECT_EQ(chunk, "6");
  producer.join();
  EXPECT_TRUE(pushed);
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
