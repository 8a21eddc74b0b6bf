// CheckpointBytes and ScratchFile (checkpoint_bytes.h): the files a pipeline's stage states
// pass through leave nothing behind, read back what was written however large, and their
// mappings outlive the file and its writer.
#include "gpu_worker/trainer/checkpoint_bytes.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>

namespace gradhub::trainer {
namespace {

namespace fs = std::filesystem;

// A fresh empty directory under the test's temp dir.
std::string EmptyDirectory(const std::string& name) {
  const fs::path dir = fs::path(::testing::TempDir()) / ("checkpoint_bytes_test_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

// Bytes that differ at every offset modulo a large prime, so a misplaced block shows.
std::string Pattern(size_t size) {
  std::string bytes(size, '\0');
  for (size_t i = 0; i < size; ++i) bytes[i] = static_cast<char>((i * 2654435761u) % 1000003 % 251);
  return bytes;
}

TEST(CheckpointBytesTest, AScratchFileHasNoNameInItsDirectory) {
  const std::string dir = EmptyDirectory("no_name");
  ScratchFile file(dir);
  file.Append("abc");
  EXPECT_TRUE(fs::is_empty(dir));
  const CheckpointBytes mapped = file.Map();
  EXPECT_TRUE(fs::is_empty(dir));
  EXPECT_EQ(mapped, "abc");
}

// Larger than several write-back blocks, appended in pieces that straddle their boundaries.
TEST(CheckpointBytesTest, AScratchFileReadsBackWhatWasAppendedAcrossWriteBackBlocks) {
  const std::string expected = Pattern(3 * ScratchFile::kWritebackBytes + 12345);
  ScratchFile file(EmptyDirectory("large"));
  for (size_t offset = 0; offset < expected.size(); offset += 7'000'001) {
    file.Append(std::string_view(expected).substr(offset, 7'000'001));
  }
  EXPECT_EQ(file.size(), static_cast<int64_t>(expected.size()));
  const CheckpointBytes mapped = file.Map();
  EXPECT_TRUE(mapped.mapped());
  EXPECT_TRUE(mapped.view() == expected);
}

TEST(CheckpointBytesTest, AMappingOutlivesItsScratchFile) {
  CheckpointBytes mapped;
  {
    ScratchFile file(EmptyDirectory("outlives"));
    file.Append("state");
    mapped = file.Map();
  }
  const CheckpointBytes slice = mapped.Slice(1, 3);
  mapped = CheckpointBytes();
  EXPECT_EQ(slice, "tat");
}

// A header whose fields are known only once what follows it was written.
TEST(CheckpointBytesTest, OverwritingReplacesBytesAlreadyAppendedAndNothingPastTheEnd) {
  ScratchFile file(EmptyDirectory("overwrite"));
  file.Append("size=?;payload");
  file.Overwrite(5, "7");
  EXPECT_THROW(file.Overwrite(12, "abc"), std::out_of_range);
  EXPECT_THROW(file.Overwrite(-1, "a"), std::out_of_range);
  EXPECT_EQ(file.Map(), "size=7;payload");
  EXPECT_THROW(file.Overwrite(0, "s"), std::logic_error);
}

TEST(CheckpointBytesTest, AnEmptyScratchFileMapsToNoBytes) {
  ScratchFile file(EmptyDirectory("empty"));
  EXPECT_TRUE(file.Map().empty());
}

TEST(CheckpointBytesTest, AppendingAfterMapIsALogicError) {
  ScratchFile file(EmptyDirectory("after_map"));
  file.Map();
  EXPECT_THROW(file.Append("late"), std::logic_error);
}

TEST(CheckpointBytesTest, AScratchFileInADirectoryThatIsNotThereNamesIt) {
  try {
    ScratchFile file(EmptyDirectory("missing") + "/not-there");
    FAIL() << "expected std::runtime_error";
  } catch (const std::runtime_error& error) {
    EXPECT_NE(std::string(error.what()).find("not-there"), std::string::npos) << error.what();
  }
}

TEST(CheckpointBytesTest, AMappedFileStaysReadableAfterItIsRemoved) {
  const std::string path = EmptyDirectory("removed") + "/ckpt";
  std::ofstream(path) << "checkpoint";
  const CheckpointBytes mapped = CheckpointBytes::MapFile(path);
  fs::remove(path);
  EXPECT_EQ(mapped, "checkpoint");
  EXPECT_THROW(CheckpointBytes::MapFile(path), std::runtime_error);
}

TEST(CheckpointBytesTest, ASliceOutsideTheBytesIsRefused) {
  const CheckpointBytes bytes(std::string("0123456789"));
  EXPECT_EQ(bytes.Slice(2, 3), "234");
  EXPECT_EQ(bytes.Slice(10, 0), "");
  EXPECT_FALSE(bytes.mapped());
  EXPECT_THROW(bytes.Slice(8, 3), std::out_of_range);
  EXPECT_THROW(bytes.Slice(11, 0), std::out_of_range);
}

TEST(CheckpointBytesTest, ReclaimGivesTheMemoryOfBytesNothingElseHolds) {
  std::string original = Pattern(1 << 20);
  const char* const memory = original.data();
  CheckpointBytes bytes(std::move(original));
  std::string reclaimed = CheckpointBytes::Reclaim(std::move(bytes));
  EXPECT_TRUE(reclaimed.empty());
  EXPECT_EQ(reclaimed.data(), memory);  // the same allocation, to be written again
  EXPECT_GE(reclaimed.capacity(), size_t{1} << 20);
}

TEST(CheckpointBytesTest, ReclaimLeavesBytesThatAreStillHeldOrMapped) {
  const CheckpointBytes bytes(Pattern(4096));
  const CheckpointBytes held = bytes;  // an upload still reading them
  EXPECT_EQ(CheckpointBytes::Reclaim(bytes).capacity(), std::string().capacity());
  EXPECT_EQ(held, Pattern(4096));
  EXPECT_EQ(bytes, Pattern(4096));
  const CheckpointBytes slice = bytes.Slice(0, 10);
  EXPECT_TRUE(CheckpointBytes::Reclaim(bytes.Slice(0, 10)).empty());
  EXPECT_EQ(slice, Pattern(10));

  const std::string path = EmptyDirectory("reclaim") + "/ckpt";
  std::ofstream(path) << "checkpoint";
  EXPECT_EQ(CheckpointBytes::Reclaim(CheckpointBytes::MapFile(path)).capacity(),
            std::string().capacity());
}

}  // namespace
}  // namespace gradhub::trainer
