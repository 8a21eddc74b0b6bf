// gradhub_ignore.h: each rule of the .gradhubignore subset (code_archive.h), a test each.
#include "services/common/code_archive/gradhub_ignore.h"

#include <gtest/gtest.h>

#include <string>

namespace gradhub::code {
namespace {

IgnoreRules Rules(const std::string& text) {
  absl::StatusOr<IgnoreRules> rules = IgnoreRules::Parse(text);
  EXPECT_TRUE(rules.ok()) << rules.status();
  return rules.ok() ? *rules : IgnoreRules();
}

bool File(const IgnoreRules& rules, const std::string& path) { return rules.Excludes(path, false); }
bool Dir(const IgnoreRules& rules, const std::string& path) { return rules.Excludes(path, true); }

TEST(GradhubIgnoreTest, NoPatternsExcludeNothing) {
  const IgnoreRules none;
  EXPECT_FALSE(File(none, "a.py"));
  EXPECT_FALSE(Dir(none, ".git"));
}

TEST(GradhubIgnoreTest, BlankLinesAndCommentsAreSkipped) {
  const IgnoreRules rules = Rules("\n# a.py\n   \n\t\nb.py\n");
  EXPECT_FALSE(File(rules, "a.py"));
  EXPECT_FALSE(File(rules, "# a.py"));
  EXPECT_TRUE(File(rules, "b.py"));
}

TEST(GradhubIgnoreTest, TrailingSpacesAndCarriageReturnsAreDropped) {
  const IgnoreRules rules = Rules("a.py   \r\nb.py\r\n");
  EXPECT_TRUE(File(rules, "a.py"));
  EXPECT_TRUE(File(rules, "b.py"));
}

TEST(GradhubIgnoreTest, StarMatchesAnyRunButNotASlash) {
  const IgnoreRules rules = Rules("*.pyc\ndoc/*.txt\n");
  EXPECT_TRUE(File(rules, "a.pyc"));
  EXPECT_TRUE(File(rules, ".pyc"));
  EXPECT_FALSE(File(rules, "a.py"));
  EXPECT_TRUE(File(rules, "doc/a.txt"));
  EXPECT_FALSE(File(rules, "doc/sub/a.txt"));
}

TEST(GradhubIgnoreTest, QuestionMarkMatchesOneCharacterButNotASlash) {
  const IgnoreRules rules = Rules("file?.txt\na?b\n");
  EXPECT_TRUE(File(rules, "file1.txt"));
  EXPECT_FALSE(File(rules, "file.txt"));
  EXPECT_FALSE(File(rules, "file10.txt"));
  EXPECT_FALSE(File(rules, "a/b"));
}

TEST(GradhubIgnoreTest, PatternWithoutASlashMatchesAtAnyDepth) {
  const IgnoreRules rules = Rules("__pycache__\n");
  EXPECT_TRUE(Dir(rules, "__pycache__"));
  EXPECT_TRUE(Dir(rules, "a/b/__pycache__"));
  EXPECT_FALSE(Dir(rules, "a/__pycache__x"));
}

TEST(GradhubIgnoreTest, LeadingSlashAnchorsToTheTop) {
  const IgnoreRules rules = Rules("/build\n");
  EXPECT_TRUE(Dir(rules, "build"));
  EXPECT_FALSE(Dir(rules, "src/build"));
}

TEST(GradhubIgnoreTest, SlashInsideAnchorsToTheTop) {
  const IgnoreRules rules = Rules("src/gen\n");
  EXPECT_TRUE(Dir(rules, "src/gen"));
  EXPECT_FALSE(Dir(rules, "x/src/gen"));
}

TEST(GradhubIgnoreTest, TrailingSlashMatchesDirectoriesOnly) {
  const IgnoreRules rules = Rules("build/\n");
  EXPECT_TRUE(Dir(rules, "build"));
  EXPECT_TRUE(Dir(rules, "a/build"));
  EXPECT_FALSE(File(rules, "build"));
}

TEST(GradhubIgnoreTest, LeadingDoubleStarMatchesInEveryFolder) {
  const IgnoreRules rules = Rules("**/cache\n");
  EXPECT_TRUE(Dir(rules, "cache"));
  EXPECT_TRUE(Dir(rules, "a/b/cache"));
  EXPECT_FALSE(Dir(rules, "a/cachex"));
}

TEST(GradhubIgnoreTest, InnerDoubleStarMatchesAnyNumberOfFolders) {
  const IgnoreRules rules = Rules("a/**/b\n");
  EXPECT_TRUE(File(rules, "a/b"));
  EXPECT_TRUE(File(rules, "a/x/b"));
  EXPECT_TRUE(File(rules, "a/x/y/b"));
  EXPECT_FALSE(File(rules, "c/a/b"));
}

TEST(GradhubIgnoreTest, TrailingDoubleStarMatchesEverythingInsideButNotTheFolder) {
  const IgnoreRules rules = Rules("logs/**\n");
  EXPECT_FALSE(Dir(rules, "logs"));
  EXPECT_TRUE(File(rules, "logs/a"));
  EXPECT_TRUE(Dir(rules, "logs/a/b"));
}

TEST(GradhubIgnoreTest, BangReincludesAndTheLastMatchDecides) {
  const IgnoreRules rules = Rules("*.log\n!keep.log\n");
  EXPECT_TRUE(File(rules, "a.log"));
  EXPECT_FALSE(File(rules, "keep.log"));
  EXPECT_FALSE(File(rules, "sub/keep.log"));
  const IgnoreRules reversed = Rules("!keep.log\n*.log\n");
  EXPECT_TRUE(File(reversed, "keep.log"));
}

TEST(GradhubIgnoreTest, NothingIsExcludedImplicitly) {
  const IgnoreRules rules = Rules("*.pyc\n");
  EXPECT_FALSE(Dir(rules, ".git"));
  EXPECT_FALSE(File(rules, ".gradhubignore"));
}

TEST(GradhubIgnoreTest, UnsupportedSyntaxIsRefusedNamingTheLine) {
  EXPECT_EQ(IgnoreRules::Parse("a\n# x\n[abc].py\n").status().message(),
            ".gradhubignore line 3: \"[abc].py\": character classes ([...]) and backslash "
            "escapes are not supported");
  EXPECT_EQ(IgnoreRules::Parse("\\#hash\n").status().message(),
            ".gradhubignore line 1: \"\\#hash\": character classes ([...]) and backslash "
            "escapes are not supported");
  EXPECT_EQ(IgnoreRules::Parse("ok\n!\n").status().message(),
            ".gradhubignore line 2: an empty pattern");
}

}  // namespace
}  // namespace gradhub::code
