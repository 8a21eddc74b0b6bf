#include "services/common/sha256.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

namespace gradhub {
namespace {

TEST(Sha256Test, KnownVectors) {
  // FIPS 180-2 test vectors.
  EXPECT_EQ(Sha256Hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(Sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(Sha256Test, OfFileHashesEveryBlockAndNamesAMissingFile) {
  char path[] = "/tmp/sha256-test-XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  close(fd);
  // More than one of its 4 MiB reads, not a multiple of them.
  std::string data((size_t{9} << 20) + 3, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 7 + i / 4096);
  std::ofstream(path, std::ios::binary) << data;
  const absl::StatusOr<std::string> sha = Sha256OfFile(path);
  unlink(path);
  ASSERT_TRUE(sha.ok()) << sha.status();
  EXPECT_EQ(*sha, Sha256Hex(data));

  const absl::StatusOr<std::string> missing = Sha256OfFile(path);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find(path), std::string::npos);
}

}  // namespace
}  // namespace gradhub
