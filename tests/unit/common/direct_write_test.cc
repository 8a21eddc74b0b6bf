// direct_write.h: appends of every size and start land byte for byte, the file never holds
// padding, and the buffered path (no O_DIRECT) writes the same file; DirectFileReader reads
// from every offset, in pieces of every size, the bytes the file holds.
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
#include <string_view>
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

  // Appends the pieces one after another to a new file, checking its size after each, then
  // its bytes.
  void AppendEachAndCompare(const std::vector<std::string_view>& pieces) {
    const std::string path = dir_ + "/file";
    absl::StatusOr<OpenedForWrite> opened = OpenForWrite(path, O_CREAT | O_TRUNC, 0600, GetParam());
    ASSERT_TRUE(opened.ok()) << opened.status();
    std::string expected;
    for (std::string_view piece : pieces) {
      const absl::Status written =
          Append(*opened, piece, static_cast<int64_t>(expected.size()), path);
      ASSERT_TRUE(written.ok()) << written;
      expected += piece;
      struct stat st;
      ASSERT_EQ(fstat(opened->fd, &st), 0);
      EXPECT_EQ(st.st_size, static_cast<off_t>(expected.size()));
    }
    close(opened->fd);
    EXPECT_TRUE(ReadAll(path) == expected);
  }

  std::string dir_;
};

TEST_P(DirectWriteTest, AppendsOfEverySizeLandInPlaceWithoutPadding) {
  // Several staging pieces at once, then ragged appends that start mid-block.
  const std::string data = Pattern(9 * kDirectStagingBytes / 4 + 1234 + 5000 + 6 * (1 << 20), 3);
  const std::string_view all = data;
  const size_t first = 9 * kDirectStagingBytes / 4 + 1234;
  AppendEachAndCompare({all.substr(0, first), all.substr(first, 5000), all.substr(first + 5000)});
}

TEST_P(DirectWriteTest, AlignedBuffersLandInPlaceAtABoundaryAndMidBlockAlike) {
  // Whole blocks at a boundary (written as they are), a tail, then aligned memory at a file
  // offset mid-block (staged), and nothing.
  std::vector<AlignedBuffer> buffers;
  std::vector<std::string_view> pieces;
  for (size_t size :
       {size_t{1} << 20, (size_t{1} << 20) + 100, 3 * kDirectAlignment, size_t{0}, size_t{7}}) {
    buffers.emplace_back().Append(Pattern(size, static_cast<int>(size % 97)));
    ASSERT_EQ(reinterpret_cast<uintptr_t>(buffers.back().data()) % kDirectAlignment, 0u);
  }
  for (const AlignedBuffer& buffer : buffers) pieces.push_back(buffer.view());
  AppendEachAndCompare(pieces);
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

TEST_P(DirectWriteTest, ReadsFromEveryOffsetInPiecesOfEverySizeGiveTheFileBack) {
  const std::string path = dir_ + "/file";
  const std::string content = Pattern(3 * kDirectAlignment + 1234, 5);
  std::ofstream(path, std::ios::binary) << content;
  // The Direct case must read with O_DIRECT wherever the filesystem takes it, as writes do.
  absl::StatusOr<OpenedForWrite> probe = OpenForWrite(path, 0, 0600, /*direct=*/true);
  ASSERT_TRUE(probe.ok()) << probe.status();
  close(probe->fd);
  const bool expect_direct = GetParam() && probe->direct;
  for (const size_t offset : {size_t{0}, size_t{1}, kDirectAlignment - 1, kDirectAlignment,
                              size_t{5000}, content.size() - 1, content.size()}) {
    for (const size_t piece : {size_t{1}, kDirectAlignment - 1, kDirectAlignment,
                               kDirectAlignment + 1, size_t{10000}, size_t{1} << 20}) {
      SCOPED_TRACE(::testing::Message() << "offset " << offset << ", pieces of " << piece);
      absl::StatusOr<std::unique_ptr<DirectFileReader>> reader =
          DirectFileReader::Open(path, static_cast<int64_t>(offset), GetParam());
      ASSERT_TRUE(reader.ok()) << reader.status();
      EXPECT_EQ((*reader)->direct(), expect_direct);
      EXPECT_EQ((*reader)->size(), static_cast<int64_t>(content.size()));
      std::string read, next;
      do {
        ASSERT_TRUE((*reader)->Read(piece, &next).ok());
        // Whole pieces until the end: a short one is the last before the empty one.
        if (next.size() < piece) {
          EXPECT_EQ(read.size() + next.size(), content.size() - offset);
        }
        read += next;
      } while (!next.empty());
      EXPECT_TRUE(read == content.substr(offset));
    }
  }
}

TEST_P(DirectWriteTest, ReadingAMissingFileIsNotFoundAndPastItsEndOutOfRange) {
  EXPECT_TRUE(absl::IsNotFound(DirectFileReader::Open(dir_ + "/missing", 0, GetParam()).status()));
  const std::string path = dir_ + "/file";
  std::ofstream(path, std::ios::binary) << "four";
  EXPECT_TRUE(absl::IsOutOfRange(DirectFileReader::Open(path, 5, GetParam()).status()));
  EXPECT_TRUE(absl::IsOutOfRange(DirectFileReader::Open(path, -1, GetParam()).status()));
  EXPECT_TRUE(DirectFileReader::Open(path, 4, GetParam()).ok());
}

INSTANTIATE_TEST_SUITE_P(DirectAndBuffered, DirectWriteTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Direct" : "Buffered"; });

}  // namespace
}  // namespace gradhub
