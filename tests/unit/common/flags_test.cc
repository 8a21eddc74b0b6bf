#include "services/common/flags.h"

#include <gtest/gtest.h>

#include <cstdlib>

namespace gradhub {
namespace {

struct Config {
  std::string url = "default-url";
  int64_t port = 7070;
  bool tls = false;
  absl::Duration timeout = absl::Seconds(5);
};

Flags Register(Config* config) {
  Flags flags("prog", "A test program.");
  flags.String("url", "GRADHUB_TEST_URL", &config->url, "where")
      .Int("port", "GRADHUB_TEST_PORT", &config->port, "port")
      .Bool("tls", "GRADHUB_TEST_TLS", &config->tls, "tls")
      .Duration("timeout", "GRADHUB_TEST_TIMEOUT", &config->timeout, "timeout");
  return flags;
}

class FlagsTest : public ::testing::Test {
 protected:
  void TearDown() override {
    for (const char* name :
         {"GRADHUB_TEST_URL", "GRADHUB_TEST_PORT", "GRADHUB_TEST_TLS", "GRADHUB_TEST_TIMEOUT"}) {
      unsetenv(name);
    }
  }
};

TEST_F(FlagsTest, FlagBeatsEnvironmentBeatsDefault) {
  setenv("GRADHUB_TEST_URL", "env-url", 1);
  setenv("GRADHUB_TEST_PORT", "8080", 1);
  Config config;
  const char* argv[] = {"prog", "--port=9090", "serve", "--tls", "--timeout", "250ms"};
  auto parsed = Register(&config).Parse(6, argv);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(config.url, "env-url");
  EXPECT_EQ(config.port, 9090);
  EXPECT_TRUE(config.tls);
  EXPECT_EQ(config.timeout, absl::Milliseconds(250));
  EXPECT_EQ(parsed->positional, std::vector<std::string>{"serve"});
  EXPECT_FALSE(parsed->help);
}

TEST_F(FlagsTest, ErrorsNameTheFlagOrVariable) {
  Config config;
  const char* unknown[] = {"prog", "--nope=1"};
  auto parsed = Register(&config).Parse(2, unknown);
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(parsed.status().message().find("--nope"), std::string::npos);

  const char* bad_int[] = {"prog", "--port", "seventy"};
  parsed = Register(&config).Parse(3, bad_int);
  EXPECT_NE(parsed.status().message().find("--port"), std::string::npos);

  setenv("GRADHUB_TEST_TIMEOUT", "forever", 1);
  const char* none[] = {"prog"};
  parsed = Register(&config).Parse(1, none);
  EXPECT_NE(parsed.status().message().find("$GRADHUB_TEST_TIMEOUT"), std::string::npos);
}

TEST_F(FlagsTest, UsageListsFlagsVariablesAndDefaults) {
  Config config;
  Flags flags = Register(&config);
  const char* argv[] = {"prog", "--help"};
  auto parsed = flags.Parse(2, argv);
  ASSERT_TRUE(parsed.ok());
  EXPECT_TRUE(parsed->help);
  std::string usage = flags.Usage();
  EXPECT_NE(usage.find("--port  [$GRADHUB_TEST_PORT]"), std::string::npos) << usage;
  EXPECT_NE(usage.find("(default 7070)"), std::string::npos) << usage;
}

}  // namespace
}  // namespace gradhub

namespace gradhub {
namespace {

// A repeatable flag (gradhub-agent --data-root): every occurrence appends, the first replaces
// the default, and the variable is a ':'-separated list used only without the flag.
TEST(FlagsListTest, RepeatedFlagsAppendAndTheVariableIsAColonList) {
  std::vector<std::string> roots = {"/default"};
  Flags flags("prog", "A test program.");
  flags.StringList("root", "GRADHUB_TEST_ROOTS", &roots, "roots");
  const char* argv[] = {"prog", "--root", "/a", "--root=/b"};
  ASSERT_TRUE(flags.Parse(4, argv).ok());
  EXPECT_EQ(roots, (std::vector<std::string>{"/a", "/b"}));

  roots = {"/default"};
  setenv("GRADHUB_TEST_ROOTS", "/x:/y", 1);
  const char* none[] = {"prog"};
  ASSERT_TRUE(flags.Parse(1, none).ok());
  EXPECT_EQ(roots, (std::vector<std::string>{"/x", "/y"}));
  roots = {"/default"};
  ASSERT_TRUE(flags.Parse(4, argv).ok());
  EXPECT_EQ(roots, (std::vector<std::string>{"/a", "/b"})) << "the flag beats the variable";
  unsetenv("GRADHUB_TEST_ROOTS");
}

TEST(HideSecretFlagValues, BlanksTheSecretsValuesInBothFormsAndNothingElse) {
  std::string program = "gradhub-api", token = "--admin-token", secret = "s3cret",
              url = "--database-url=postgresql://u:pw@h/db", other = "--grpc-port", port = "7070";
  char* argv[] = {program.data(), token.data(), secret.data(),
                  url.data(),     other.data(), port.data()};
  HideSecretFlagValues(6, argv, {"--admin-token", "--database-url"});
  EXPECT_STREQ(argv[0], "gradhub-api");
  EXPECT_STREQ(argv[1], "--admin-token");
  EXPECT_STREQ(argv[2], "xxxxxx");
  EXPECT_EQ(std::string(argv[3]), "--database-url=" + std::string(22, 'x'));
  EXPECT_STREQ(argv[5], "7070");
}

}  // namespace
}  // namespace gradhub
