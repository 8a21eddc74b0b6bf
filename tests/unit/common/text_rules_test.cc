#include "services/common/text_rules.h"

#include <gtest/gtest.h>

#include <string>

namespace gradhub {
namespace {

TEST(TextRulesTest, Utf8IsCheckedAsRfc3629DefinesIt) {
  for (const char* valid : {"", "plain", "caf\xc3\xa9", "\xe2\x82\xac", "\xf0\x9f\x98\x80",
                            "\xf4\x8f\xbf\xbf" /* U+10FFFF */}) {
    EXPECT_TRUE(IsValidUtf8(valid)) << valid;
  }
  for (const char* invalid :
       {"\xff", "\xc3", "\xc0\x80" /* overlong NUL */, "\xe0\x80\x80" /* overlong */,
        "\xed\xa0\x80" /* surrogate */, "\xf4\x90\x80\x80" /* past U+10FFFF */, "ok\x80"}) {
    EXPECT_FALSE(IsValidUtf8(invalid)) << invalid;
  }
}

TEST(TextRulesTest, CharactersAreCodePoints) {
  EXPECT_EQ(CountCharacters(""), 0u);
  EXPECT_EQ(CountCharacters("abc"), 3u);
  EXPECT_EQ(CountCharacters("caf\xc3\xa9"), 4u);
  EXPECT_EQ(CountCharacters("\xf0\x9f\x98\x80\xe2\x82\xac"), 2u);
  EXPECT_EQ(CountCharacters("\xff\xfe"), 2u);  // a stray byte counts as one
}

TEST(TextRulesTest, TextProblemNamesNulAndInvalidBytesWithTheirOffset) {
  EXPECT_EQ(TextProblem("fine \xc3\xa9"), "");
  EXPECT_EQ(TextProblem(std::string("ab\0c", 4)), "holds a NUL character (at byte 2)");
  EXPECT_EQ(TextProblem("abc\xff"), "is not valid UTF-8 (at byte 3)");
}

TEST(TextRulesTest, LimitsCountCharactersAndSaySo) {
  std::string accents;
  for (int i = 0; i < 10; ++i) accents += "\xc3\xa9";  // 10 characters, 20 bytes
  EXPECT_EQ(TextLimitProblem(accents, 10), "");
  EXPECT_EQ(TextLimitProblem(accents + "x", 10),
            "is 11 characters long; at most 10 (characters are Unicode code points)");
  EXPECT_EQ(TextLimitProblem(std::string(1, '\0'), 10), "holds a NUL character (at byte 0)");
}

TEST(TextRulesTest, CheckTextsNamesTheFirstBadText) {
  EXPECT_TRUE(CheckTexts({{"pageToken", "abc"}, {"name", "jobs/x"}}).ok());
  const absl::Status refused =
      CheckTexts({{"pageToken", "abc"}, {"requestId", std::string("r1\0x", 4)}, {"name", "\xff"}});
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(refused.message(), "requestId: holds a NUL character (at byte 2)");
}

}  // namespace
}  // namespace gradhub
