#include "services/common/json_text.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace gradhub {
namespace {

TEST(QuoteJsonTest, EscapesQuotesBackslashesAndControlCharacters) {
  EXPECT_EQ(QuoteJson(""), "\"\"");
  EXPECT_EQ(QuoteJson("a\"b\\c"), "\"a\\\"b\\\\c\"");
  EXPECT_EQ(QuoteJson("\n\r\t"), "\"\\n\\r\\t\"");
  EXPECT_EQ(QuoteJson(std::string("\x01\x1f", 2)), "\"\\u0001\\u001f\"");
  EXPECT_EQ(QuoteJson("päd"), "\"päd\"");  // UTF-8 passes through
}

TEST(QuoteJsonTest, AJsonParserReadsBackWhatWasQuoted) {
  const std::string text = "line \"one\"\\\n\ttwo \x02 end ünïcode";
  EXPECT_EQ(nlohmann::json::parse(QuoteJson(text)).get<std::string>(), text);
}

}  // namespace
}  // namespace gradhub
