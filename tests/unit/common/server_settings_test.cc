#include "services/common/server_settings.h"

#include <gtest/gtest.h>

#include <cstdlib>

namespace gradhub {
namespace {

// Each server declares its defaults and what differs; the shared flags read the same on all.
ServerSettings MetricsLike() {
  return ServerSettings{.database = {.connections = 4}, .shutdown_grace = absl::Seconds(2)};
}
const ServerSettings::Spec kMetricsSpec{.connections_env = "GRADHUB_TEST_CONNECTIONS",
                                        .migrates = false,
                                        .tls_effect = "gRPC serves TLS only"};

TEST(ServerSettingsTest, HelpListsEverySharedFlagWithItsVariableAndTheServersDefault) {
  ServerSettings settings = MetricsLike();
  Flags flags("prog", "A test server.");
  settings.Register(flags, kMetricsSpec);
  const std::string usage = flags.Usage();
  for (const char* line :
       {"--database-url  [$GRADHUB_DATABASE_URL]",
        "--database-connect-timeout  [$GRADHUB_DATABASE_CONNECT_TIMEOUT]",
        "--database-silence-timeout  [$GRADHUB_DATABASE_SILENCE_TIMEOUT]",
        "--database-connections  [$GRADHUB_TEST_CONNECTIONS]",
        "--admin-token  [$GRADHUB_ADMIN_TOKEN]", "--shutdown-grace  [$GRADHUB_SHUTDOWN_GRACE]",
        "--tls-cert  [$GRADHUB_TLS_CERT]", "--tls-key  [$GRADHUB_TLS_KEY]", "(default 4)",
        "(default 2s)", "gRPC serves TLS only"}) {
    EXPECT_NE(usage.find(line), std::string::npos) << line << " missing from\n" << usage;
  }
  // Only a server that migrates waits for the migration lock.
  EXPECT_EQ(usage.find("--migration-lock-timeout"), std::string::npos) << usage;
}

TEST(ServerSettingsTest, AServerThatMigratesHasTheMigrationLockTimeout) {
  ServerSettings settings;
  Flags flags("prog", "A test server.");
  settings.Register(flags, {.connections_env = "GRADHUB_TEST_CONNECTIONS", .migrates = true});
  EXPECT_NE(flags.Usage().find("--migration-lock-timeout  [$GRADHUB_MIGRATION_LOCK_TIMEOUT]"),
            std::string::npos);
}

TEST(ServerSettingsTest, FlagsAndVariablesFillTheSettings) {
  setenv("GRADHUB_ADMIN_TOKEN", "from-env", 1);
  ServerSettings settings = MetricsLike();
  Flags flags("prog", "A test server.");
  settings.Register(flags, kMetricsSpec);
  const char* argv[] = {"prog",
                        "--tls-cert",
                        "cert.pem",
                        "--tls-key=key.pem",
                        "--shutdown-grace",
                        "500ms",
                        "--database-connections",
                        "9"};
  ASSERT_TRUE(flags.Parse(8, argv).ok());
  unsetenv("GRADHUB_ADMIN_TOKEN");
  EXPECT_EQ(settings.admin_token, "from-env");
  EXPECT_EQ(settings.tls.cert_file, "cert.pem");
  EXPECT_EQ(settings.tls.key_file, "key.pem");
  EXPECT_EQ(settings.shutdown_grace, absl::Milliseconds(500));
  EXPECT_EQ(settings.database.connections, 9);
}

TEST(ServerSettingsTest, AMalformedValueNamesItsFlag) {
  ServerSettings settings = MetricsLike();
  Flags flags("prog", "A test server.");
  settings.Register(flags, kMetricsSpec);
  const char* argv[] = {"prog", "--shutdown-grace", "soon"};
  const auto parsed = flags.Parse(3, argv);
  ASSERT_FALSE(parsed.ok());
  EXPECT_NE(parsed.status().message().find("--shutdown-grace"), std::string::npos)
      << parsed.status().message();
}

}  // namespace
}  // namespace gradhub
