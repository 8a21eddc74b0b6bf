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

}  // namespace
}  // namespace gradhub
