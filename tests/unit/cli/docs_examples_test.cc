// Every job spec the documentation shows is one the service accepts: each ```yaml block of
// docs/architecture.md and README.md parses as a JobSpec (unknown fields and enum values are
// errors) and passes ValidateJobSpec, the check CreateJob makes. A ```yaml block there is a
// job spec by convention; other YAML would be fenced as ```text.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "services/common/contract/job_spec.h"
#include "services/common/contract/user_error.h"

namespace gradhub {
namespace {

std::string ReadSource(const std::string& relative) {
  std::ifstream in(std::string(GRADHUB_SOURCE_DIR) + "/" + relative);
  EXPECT_TRUE(in) << relative;
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The bodies of the ```yaml blocks of a Markdown text, with the line each starts on.
std::vector<std::pair<int, std::string>> YamlBlocks(const std::string& markdown) {
  std::vector<std::pair<int, std::string>> blocks;
  std::istringstream in(markdown);
  std::string line, body;
  int number = 0, start = 0;
  bool inside = false;
  while (std::getline(in, line)) {
    ++number;
    if (!inside && line == "```yaml") {
      inside = true;
      start = number + 1;
      body.clear();
    } else if (inside && line == "```") {
      inside = false;
      blocks.emplace_back(start, body);
    } else if (inside) {
      body += line + "\n";
    }
  }
  EXPECT_FALSE(inside) << "a ```yaml block without its end";
  return blocks;
}

void ExpectEveryYamlBlockIsAValidSpec(const std::string& file, size_t at_least) {
  const auto blocks = YamlBlocks(ReadSource(file));
  EXPECT_GE(blocks.size(), at_least) << file;
  for (const auto& [line, yaml] : blocks) {
    try {
      const v1::JobSpec spec = ParseJobSpec(yaml);
      for (const SpecIssue& issue : ValidateJobSpec(spec)) {
        ADD_FAILURE() << file << ":" << line << ": " << issue.field << ": " << issue.message;
      }
    } catch (const UserError& error) {
      ADD_FAILURE() << file << ":" << line << ": " << error.what();
    }
  }
}

TEST(DocsExamplesTest, EveryJobSpecInTheArchitecturePageIsValid) {
  ExpectEveryYamlBlockIsAValidSpec("docs/architecture.md", 4);
}

TEST(DocsExamplesTest, EveryJobSpecInTheReadmeIsValid) {
  ExpectEveryYamlBlockIsAValidSpec("README.md", 1);
}

TEST(DocsExamplesTest, AFieldTheParserRejectsIsCaught) {
  // What the old design page had: csv.labelColumn, which is not a field.
  EXPECT_THROW(ParseJobSpec("dataset: {csv: {path: /d.csv, labelColumn: -1}}\n"), UserError);
}

}  // namespace
}  // namespace gradhub
