#include "services/common/page_token.h"

#include <gtest/gtest.h>

#include <limits>
#include <string>

#include "absl/strings/escaping.h"

namespace gradhub {
namespace {

TEST(PageTokenTest, RoundTripsItsKeyOpaquely) {
  const std::string token = MakePageToken("jobs", {"1700000000000000", "0b9c-id"});
  EXPECT_EQ(token.find("jobs"), std::string::npos) << "opaque: " << token;
  EXPECT_EQ(token.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                                    "0123456789-_"),
            std::string::npos)
      << "URL-safe: " << token;
  auto key = ReadPageToken(token, "jobs", 2);
  ASSERT_TRUE(key.ok()) << key.status();
  EXPECT_EQ((*key)[0], "1700000000000000");
  EXPECT_EQ((*key)[1], "0b9c-id");
}

// Each failure is the same INVALID_ARGUMENT naming page_token, whatever the token holds.
void ExpectRefused(const absl::Status& status, const std::string& what) {
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << what;
  EXPECT_EQ(status.message(), "page_token: not a token this server returned") << what;
}

TEST(PageTokenTest, RefusesWhatThisServerCouldNotHaveMade) {
  const std::string jobs = MakePageToken("jobs", {"1", "id"});
  ExpectRefused(ReadPageToken(jobs, "nodes", 2).status(), "another list's token");
  ExpectRefused(ReadPageToken(jobs, "jobs", 1).status(), "too many parts");
  ExpectRefused(ReadPageToken(jobs, "jobs", 3).status(), "too few parts");
  ExpectRefused(ReadPageToken("not base64!", "jobs", 2).status(), "not base64");
  ExpectRefused(
      ReadPageToken(absl::WebSafeBase64Escape(std::string("jobs\n1\nid\0x", 11)), "jobs", 2)
          .status(),
      "a NUL inside");
  ExpectRefused(ReadPageToken(absl::WebSafeBase64Escape("jobs\n1\n\xff"), "jobs", 2).status(),
                "invalid UTF-8 inside");
  ExpectRefused(ReadPageToken(std::string(2000, 'A'), "jobs", 2).status(), "too long");
}

TEST(PageTokenTest, IntegersAreCheckedAgainstTheirRange) {
  EXPECT_EQ(*PageTokenInt("42", 0, 100), 42);
  ExpectRefused(PageTokenInt("-1", 0, 100).status(), "below");
  ExpectRefused(PageTokenInt("101", 0, 100).status(), "above");
  ExpectRefused(
      PageTokenInt("99999999999999999999", 0, std::numeric_limits<int64_t>::max()).status(),
      "past int64");
  ExpectRefused(PageTokenInt("12abc", 0, 100).status(), "not a number");
  EXPECT_TRUE(PageTokenInt("253402300799999999", 0, kMaxTimestampMicros).ok());
  ExpectRefused(PageTokenInt("253402300800000000", 0, kMaxTimestampMicros).status(),
                "past year 9999");
}

TEST(PageTokenTest, ANameTokenIsEmptyForTheFirstPage) {
  EXPECT_EQ(*ReadNamePageToken("", "tenants"), "");
  EXPECT_EQ(*ReadNamePageToken(MakePageToken("tenants", {"team-a"}), "tenants"), "team-a");
  ExpectRefused(ReadNamePageToken("team-a", "tenants").status(), "a raw name");
}

}  // namespace
}  // namespace gradhub
