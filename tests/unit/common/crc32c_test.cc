#include "services/common/crc32c.h"

#include <gtest/gtest.h>

#include <string>

namespace gradhub {
namespace {

TEST(Crc32cTest, KnownVectors) {
  EXPECT_EQ(Crc32c(""), 0u);
  EXPECT_EQ(Crc32c("123456789"), 0xe3069283u);
  // RFC 3720 (iSCSI), appendix B.4.
  EXPECT_EQ(Crc32c(std::string(32, '\0')), 0x8a9136aau);
  EXPECT_EQ(Crc32c(std::string(32, '\xff')), 0x62a8ab43u);
}

TEST(Crc32cTest, ExtendingEqualsTheCrcOfTheWhole) {
  std::string data;
  for (int i = 0; i < 100000; ++i) data.push_back(static_cast<char>(i * 7919 % 251));
  const uint32_t whole = Crc32c(data);
  for (size_t split : {size_t{0}, size_t{1}, size_t{4095}, size_t{65536}, data.size()}) {
    EXPECT_EQ(Crc32cExtend(Crc32c(data.substr(0, split)), data.substr(split)), whole) << split;
  }
  EXPECT_NE(Crc32c(data.substr(1)), whole);
}

TEST(Crc32cTest, CombiningTheCrcsOfTwoPartsEqualsTheCrcOfTheWhole) {
  std::string data;
  for (uint32_t i = 0; i < 300000; ++i)
    data.push_back(static_cast<char>(i * 7919 % 251 + i / 4099));
  const uint32_t whole = Crc32c(data);
  for (size_t split : {size_t{0}, size_t{1}, size_t{7}, size_t{4096}, size_t{100003},
                       data.size() - 1, data.size()}) {
    const std::string a = data.substr(0, split), b = data.substr(split);
    EXPECT_EQ(Crc32cCombine(Crc32c(a), Crc32c(b), b.size()), whole) << split;
  }
  // Chunk by chunk, as an upload's batches are built.
  uint32_t combined = 0;
  for (size_t at = 0; at < data.size(); at += 65536) {
    const std::string chunk = data.substr(at, 65536);
    combined = Crc32cCombine(combined, Crc32c(chunk), chunk.size());
  }
  EXPECT_EQ(combined, whole);
}

}  // namespace
}  // namespace gradhub
