// The pipeline checkpoint's layout (pipeline_checkpoint_format.h): what the index writer
// writes reads back with every stage in place, and any byte string that is not such a
// checkpoint is refused with a reason, never read past its end.
#include "gpu_worker/trainer/pipeline_checkpoint_format.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "services/common/contract/user_error.h"

namespace gradhub::trainer {
namespace {

using ::testing::HasSubstr;

std::string TwoStages() {
  return PipelineCheckpointIndex(12, "the spec", {1.0, 2.5}, {3, 5}) + "abc" + "defgh";
}

TEST(PipelineCheckpointFormatTest, WhatIsWrittenReadsBackWithEveryStageInPlace) {
  const CheckpointBytes bytes(TwoStages());
  EXPECT_TRUE(IsPipelineCheckpoint(bytes.view()));
  const PipelineCheckpoint read = ReadPipelineCheckpoint(bytes);
  EXPECT_EQ(read.step, 12);
  EXPECT_EQ(read.spec, "the spec");
  EXPECT_EQ(read.layer_costs, (std::vector<double>{1.0, 2.5}));
  ASSERT_EQ(read.stage_states.size(), 2u);
  EXPECT_EQ(read.stage_states[0], "abc");
  EXPECT_EQ(read.stage_states[1], "defgh");
  // Slices of the bytes read, not copies.
  EXPECT_EQ(read.stage_states[1].view().data(), bytes.view().data() + bytes.size() - 5);
}

TEST(PipelineCheckpointFormatTest, EmptyFieldsReadBack) {
  const PipelineCheckpoint read = ReadPipelineCheckpoint(PipelineCheckpointIndex(0, "", {}, {0}));
  EXPECT_EQ(read.spec, "");
  EXPECT_TRUE(read.layer_costs.empty());
  ASSERT_EQ(read.stage_states.size(), 1u);
  EXPECT_TRUE(read.stage_states[0].empty());
}

void ExpectRefused(const std::string& bytes, const std::string& reason) {
  try {
    ReadPipelineCheckpoint(bytes);
    ADD_FAILURE() << "expected UserError for: " << reason;
  } catch (const UserError& error) {
    EXPECT_EQ(error.field(), "checkpoint");
    EXPECT_THAT(error.what(), HasSubstr(reason));
  }
}

TEST(PipelineCheckpointFormatTest, EveryTruncationIsRefused) {
  const std::string whole = TwoStages();
  for (size_t size = 0; size < whole.size(); ++size) {
    SCOPED_TRACE(size);
    EXPECT_THROW(ReadPipelineCheckpoint(whole.substr(0, size)), UserError);
  }
}

TEST(PipelineCheckpointFormatTest, BytesAfterTheLastStageAreRefused) {
  ExpectRefused(TwoStages() + "x", "1 bytes follow the last stage");
}

TEST(PipelineCheckpointFormatTest, AnArchiveWithoutTheMagicIsRefused) {
  EXPECT_FALSE(IsPipelineCheckpoint("PK\x03\x04"));
  ExpectRefused("PK\x03\x04", "no magic");
}

// Counts as large as a u64 holds must be refused before anything is allocated for them.
TEST(PipelineCheckpointFormatTest, ACountLargerThanTheIndexIsRefused) {
  std::string bytes = PipelineCheckpointIndex(1, "s", {}, {});
  // The cost count sits after magic (8), index_size (8), step (8), spec_size (8) and "s".
  const size_t cost_count = 8 + 8 + 8 + 8 + 1;
  const uint64_t huge = ~uint64_t{0} / 4;
  std::memcpy(&bytes[cost_count], &huge, sizeof(huge));
  ExpectRefused(bytes, "cost_count");
}

TEST(PipelineCheckpointFormatTest, AStageLargerThanTheRestIsRefused) {
  ExpectRefused(PipelineCheckpointIndex(1, "", {}, {4}) + "abc", "stage 0's 4 bytes run past");
}

TEST(PipelineCheckpointFormatTest, ANegativeStepIsRefused) {
  ExpectRefused(PipelineCheckpointIndex(-1, "", {}, {}), "step -1");
}

}  // namespace
}  // namespace gradhub::trainer
