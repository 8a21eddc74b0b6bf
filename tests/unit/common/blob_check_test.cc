#include "services/common/blob_check.h"

#include <gtest/gtest.h>

#include <string>

#include "absl/strings/str_format.h"
#include "services/common/crc32c.h"
#include "services/common/sha256.h"

namespace gradhub {
namespace {

// Not a multiple of any block size.
std::string Blob() {
  std::string data;
  for (uint32_t i = 0; i < 700001; ++i) data.push_back(static_cast<char>(i * 2654435761u >> 24));
  return data;
}

// Hands `data` to `check` in uneven pieces, as chunks of a stream arrive.
void Feed(BlobCheck& check, const std::string& data) {
  for (size_t at = 0, size = 1; at < data.size(); at += size, size = size * 3 + 7) {
    std::string piece = data.substr(at, size);
    check.Update(&piece);
  }
}

TEST(BlobCheckTest, WithACrc32cTheBytesAreCheckedAgainstItAlone) {
  const std::string data = Blob();
  // A sha256 that names other bytes does not matter: the CRC is the check.
  BlobCheck check(Sha256Hex("other"), Crc32c(data));
  Feed(check, data);
  EXPECT_TRUE(check.Matches());
  EXPECT_EQ(check.Expected(), absl::StrFormat("crc32c %08x", Crc32c(data)));

  std::string changed = data;
  changed[123456] ^= 0x10;
  BlobCheck flipped(Sha256Hex(data), Crc32c(data));
  Feed(flipped, changed);
  EXPECT_FALSE(flipped.Matches());
}

TEST(BlobCheckTest, WithoutACrc32cTheBytesAreCheckedAgainstTheSha256) {
  const std::string data = Blob();
  BlobCheck check(Sha256Hex(data), std::nullopt);
  Feed(check, data);
  EXPECT_TRUE(check.Matches());
  EXPECT_EQ(check.Expected(), "sha256 " + Sha256Hex(data));

  BlobCheck short_one(Sha256Hex(data), std::nullopt);
  Feed(short_one, data.substr(0, data.size() - 1));
  EXPECT_FALSE(short_one.Matches());
}

TEST(BlobCheckTest, BlobMatchesChecksAWholeCopyTheSameWay) {
  const std::string data = Blob();
  std::string changed = data;
  changed.back() ^= 1;
  EXPECT_TRUE(BlobMatches(data, Sha256Hex(data), Crc32c(data)));
  EXPECT_FALSE(BlobMatches(changed, Sha256Hex(data), Crc32c(data)));
  EXPECT_TRUE(BlobMatches(data, Sha256Hex(data), std::nullopt));
  EXPECT_FALSE(BlobMatches(changed, Sha256Hex(data), std::nullopt));
}

}  // namespace
}  // namespace gradhub
