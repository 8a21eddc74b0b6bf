// OpenRangeOffset (services/common/http_errors.h): the one Range form the downloads serve.
#include <gtest/gtest.h>

#include "services/common/http_errors.h"

namespace gradhub {
namespace {

TEST(OpenRangeOffset, ReadsBytesNDash) {
  EXPECT_EQ(OpenRangeOffset("bytes=0-").value_or(-1), 0);
  EXPECT_EQ(OpenRangeOffset("bytes=1048576-").value_or(-1), 1048576);
  EXPECT_EQ(OpenRangeOffset(" bytes = 7 - ").value_or(-1), 7);
}

TEST(OpenRangeOffset, RefusesEveryOtherForm) {
  for (const char* range : {"bytes=0-10", "bytes=-5", "bytes=1-,5-", "bytes=+5-", "bytes=-",
                            "items=5-", "bytes=5", "bytes=1234567890123456789-", ""}) {
    const absl::StatusOr<int64_t> offset = OpenRangeOffset(range);
    EXPECT_EQ(offset.status().code(), absl::StatusCode::kOutOfRange) << range;
  }
}

}  // namespace
}  // namespace gradhub
