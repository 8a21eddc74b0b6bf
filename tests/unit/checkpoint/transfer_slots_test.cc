// transfer_slots.h: one test per rule of its protocol.
#include "services/checkpoint/transfer_slots.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace gradhub::checkpoint {
namespace {

TEST(TransferSlotsTest, ACallerGetsSlotsUpToTheLimitPerCallerThenResourceExhausted) {
  TransferSlots slots(/*max_total=*/10, /*max_per_caller=*/2);
  absl::StatusOr<TransferSlots::Slot> first = slots.Acquire("tenant:1");
  absl::StatusOr<TransferSlots::Slot> second = slots.Acquire("tenant:1");
  ASSERT_TRUE(first.ok() && second.ok());
  const absl::StatusOr<TransferSlots::Slot> third = slots.Acquire("tenant:1");
  ASSERT_TRUE(absl::IsResourceExhausted(third.status())) << third.status();
  EXPECT_NE(third.status().message().find("--max-transfers-per-caller"), std::string::npos);
  // Another caller is not held back by the first one's limit.
  EXPECT_TRUE(slots.Acquire("node:a").ok());
}

TEST(TransferSlotsTest, NoCallerGetsASlotOnceAllAreInUse) {
  TransferSlots slots(/*max_total=*/2, /*max_per_caller=*/5);
  absl::StatusOr<TransferSlots::Slot> a = slots.Acquire("node:a");
  absl::StatusOr<TransferSlots::Slot> b = slots.Acquire("node:b");
  ASSERT_TRUE(a.ok() && b.ok());
  const absl::StatusOr<TransferSlots::Slot> c = slots.Acquire("node:c");
  ASSERT_TRUE(absl::IsResourceExhausted(c.status())) << c.status();
  EXPECT_NE(c.status().message().find("--max-transfers)"), std::string::npos);
  EXPECT_EQ(slots.in_progress(), 2);
}

TEST(TransferSlotsTest, DestroyingASlotFreesItForTheCallerAndInAll) {
  TransferSlots slots(/*max_total=*/1, /*max_per_caller=*/1);
  {
    absl::StatusOr<TransferSlots::Slot> held = slots.Acquire("tenant:1");
    ASSERT_TRUE(held.ok());
    // Moving a slot hands it on; it is freed once, by the last holder.
    TransferSlots::Slot moved = *std::move(held);
    TransferSlots::Slot again = std::move(moved);
    EXPECT_EQ(slots.in_progress(), 1);
    EXPECT_FALSE(slots.Acquire("tenant:1").ok());
  }
  EXPECT_EQ(slots.in_progress(), 0);
  EXPECT_TRUE(slots.Acquire("tenant:1").ok());
  // The slot acquired just above went at the end of its statement.
  EXPECT_TRUE(slots.Acquire("tenant:2").ok());
}

TEST(TransferSlotsTest, ChangedHearsTheTransfersInProgressAfterEveryChange) {
  std::vector<int> heard;
  TransferSlots slots(/*max_total=*/3, /*max_per_caller=*/3,
                      [&heard](int in_progress) { heard.push_back(in_progress); });
  {
    absl::StatusOr<TransferSlots::Slot> a = slots.Acquire("admin");
    absl::StatusOr<TransferSlots::Slot> b = slots.Acquire("admin");
  }
  EXPECT_EQ(heard, (std::vector<int>{1, 2, 1, 0}));
}

}  // namespace
}  // namespace gradhub::checkpoint
