// direct_write.h: appends of every size and start land byte for byte, the file never holds
// padding, and the buffered path (no O_DIRECT) writes the same file.
#include "services/common/direct_write.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace gradhub {
namespace {

namespace fs = std::filesystem;

std::string Pattern(size_t size, int seed) {
  std::string bytes(size, '\0');
  for (size_t i = 0; i < size; ++i) bytes[i] = static_cast<char>((i * 131 + seed + i / 4093));
  return bytes;
}

class DirectWriteTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "gradhub-direct-XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string ReadAll(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream all;
    all << in.rdbuf();
    return all.str();
  }

  std::string dir_;
};

TEST_P(DirectWriteTest, AppendsOfEverySizeLandInPlaceWithoutPadding) {
  const std::string path = dir_ + "/file";
  absl::StatusOr<OpenedForWrite> opened = OpenForWrite(path, O_CREAT | O_TRUNC, 0600, GetParam());
  ASSERT_TRUE(opened.ok()) << opened.status();
  // Several staging pieces at once, then ragged appends that start mid-block.
  const std::string data = Pattern(9 * kDirectStagingBytes / 4 + 1234 + 5000 + 6 * (1 << 20), 3);
  const std::vector<size_t> sizes = {9 * kDirectStagingBytes / 4 + 1234, 5000, 6 << 20};
  int64_t held = 0;
  for (size_t size : sizes) {
    const std::string_view piece = std::string_view(data).substr(static_cast<size_t>(held), size);
    const absl::Status written = Append(*opened, piece, held, path);
    ASSERT_TRUE(written.ok()) << written;
    held += static_cast<int64_t>(size);
    struct stat st;
    ASSERT_EQ(fstat(opened->fd, &st), 0);
    EXPECT_EQ(st.st_size, held);
  }
  close(opened->fd);
  EXPECT_TRUE(ReadAll(path) == data);
}

TEST_P(DirectWriteTest, AlignedBytesLandInPlaceAtABoundaryAndMidBlockAlike) {
  const std::string path = dir_ + "/file";
  absl::StatusOr<OpenedForWrite> opened = OpenForWrite(path, O_CREAT | O_TRUNC, 0600, GetParam());
  ASSERT_TRUE(opened.ok()) << opened.status();
  // Whole blocks at a boundary (written as they are), a tail, then aligned memory at a file
  // offset mid-block (staged), and nothing.
  const std::vector<size_t> sizes = {1 << 20, (1 << 20) + 100, 3 * kDirectAlignment, 0, 7};
  std::string data;
  int64_t held = 0;
  for (size_t size : sizes) {
    AlignedBuffer piece;
    piece.Append(Pattern(size, static_cast<int>(size % 97)));
    if (size > 0)
      ASSERT_EQ(reinterpret_cast<uintptr_t>(piece.view().data()) % kDirectAlignment, 0u);
    ASSERT_EQ(piece.view().size(), size);
    const absl::Status written = Append(*opened, piece.view(), held, path);
    ASSERT_TRUE(written.ok()) << written;
    data += piece.view();
    held += static_cast<int64_t>(size);
    struct stat st;
    ASSERT_EQ(fstat(opened->fd, &st), 0);
    EXPECT_EQ(st.st_size, held);
  }
  close(opened->fd);
  EXPECT_TRUE(ReadAll(path) == data);
}

TEST(AlignedBufferTest, GrowsKeepingItsBytesAndStaysAligned) {
  AlignedBuffer buffer;
  EXPECT_EQ(buffer.Append("abc"), 0u);
  EXPECT_EQ(buffer.Append(Pattern(3 * kDirectAlignment, 1)), 3u);  // grows
  EXPECT_EQ(buffer.view(), "abc" + Pattern(3 * kDirectAlignment, 1));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(buffer.data()) % kDirectAlignment, 0u);
  buffer.Truncate(2);
  EXPECT_EQ(buffer.view(), "ab");
  AlignedBuffer moved = std::move(buffer);
  EXPECT_EQ(moved.view(), "ab");
}

TEST_P(DirectWriteTest, OpeningWhatCannotBeOpenedNamesThePath) {
  absl::StatusOr<OpenedForWrite> opened =
      OpenForWrite(dir_ + "/missing/file", O_CREAT, 0600, GetParam());
  ASSERT_FALSE(opened.ok());
  EXPECT_TRUE(absl::IsNotFound(opened.status()));
  EXPECT_NE(opened.status().message().find("missing/file"), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(DirectAndBuffered, DirectWriteTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Direct" : "Buffered"; });

}  // namespace
}  // namespace gradhub
