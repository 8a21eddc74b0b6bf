// The parts of `gradhub cluster` that need no cluster: the client config, and how a recorded
// pid is told apart from a stranger's (local_process.h).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "gtest/gtest.h"
#include "services/cli/client_config.h"
#include "services/cli/local_process.h"

namespace gradhub::cli {
namespace {

class LocalClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/gradhub-local-cluster-test-XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string dir_;
};

TEST_F(LocalClusterTest, ClientConfigRoundTripsAndIsPrivate) {
  const std::string path = dir_ + "/config";
  EXPECT_TRUE(ReadClientConfig(path)->empty());  // none yet: no error
  ASSERT_TRUE(WriteClientConfig(path, {{"server", "127.0.0.1:1234"}, {"token", "ghk_x"}}).ok());
  auto config = ReadClientConfig(path);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->at("server"), "127.0.0.1:1234");
  EXPECT_EQ(config->at("token"), "ghk_x");
  EXPECT_EQ(std::filesystem::status(path).permissions() & std::filesystem::perms::all,
            std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);

  std::ofstream(path) << "# comment\n\n server = a:1 \nnot a pair\n";
  auto bad = ReadClientConfig(path);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find(":4: not KEY=VALUE"), std::string::npos) << bad.status();
}

TEST_F(LocalClusterTest, StateDirAndConfigPathFollowTheirVariables) {
  setenv("GRADHUB_STATE_DIR", dir_.c_str(), 1);
  unsetenv("GRADHUB_CONFIG");
  EXPECT_EQ(StateDir(), dir_);
  EXPECT_EQ(ClientConfigPath(), dir_ + "/config");
  setenv("GRADHUB_CONFIG", "/elsewhere/config", 1);
  EXPECT_EQ(ClientConfigPath(), "/elsewhere/config");
  unsetenv("GRADHUB_CONFIG");
  unsetenv("GRADHUB_STATE_DIR");
  setenv("XDG_STATE_HOME", "/xdg", 1);
  EXPECT_EQ(StateDir(), "/xdg/gradhub");
}

TEST_F(LocalClusterTest, OnlyAProcessWithOurMarkerAndBinaryIsOurs) {
  const std::string log = dir_ + "/sleep.log";
  auto ours = SpawnDetached({{"/bin/sleep", "30"}, {{kClusterMarker, dir_}}}, log);
  ASSERT_TRUE(ours.ok()) << ours.status();
  auto stranger = SpawnDetached({{"/bin/sleep", "30"}, {}}, log);
  ASSERT_TRUE(stranger.ok()) << stranger.status();
  // Until exec, the child's command line is still ours.
  auto exec_done = [](pid_t pid) {
    for (int i = 0; i < 200; ++i, usleep(10000)) {
      const std::vector<std::string> command = CommandLine(pid);
      if (!command.empty() && command[0] == "/bin/sleep") return true;
    }
    return false;
  };
  ASSERT_TRUE(exec_done(*ours));
  ASSERT_TRUE(exec_done(*stranger));

  EXPECT_TRUE(IsClusterProcess(*ours, "/bin/sleep", dir_));
  EXPECT_FALSE(IsClusterProcess(*ours, "/bin/sleep", dir_ + "-other"));  // another cluster's
  EXPECT_FALSE(IsClusterProcess(*ours, "/usr/bin/other", dir_));         // the pid reused
  EXPECT_FALSE(IsClusterProcess(*stranger, "/bin/sleep", dir_));         // no marker
  EXPECT_EQ(getsid(*ours), *ours);  // its own session: a ^C at our terminal misses it

  kill(*ours, SIGKILL);
  kill(*stranger, SIGKILL);
  // A zombie (not reaped yet) is not running.
  for (int i = 0; i < 100 && IsAlive(*ours); ++i) usleep(10000);
  EXPECT_FALSE(IsAlive(*ours));
  EXPECT_FALSE(IsClusterProcess(*ours, "/bin/sleep", dir_));
  waitpid(*ours, nullptr, 0);
  waitpid(*stranger, nullptr, 0);
}

TEST_F(LocalClusterTest, WaitForLogLinesReadsPortsOrReportsAnEarlyExit) {
  const std::string log = dir_ + "/service.log";
  auto ready =
      SpawnDetached({{"/bin/sh", "-c",
                      "echo 'x: serving gRPC on port 4242'; echo 'serving REST on port 80'; "
                      "exec sleep 30"},
                     {}},
                    log);
  ASSERT_TRUE(ready.ok());
  auto lines = WaitForLogLines(*ready, log, {"serving gRPC on port ", "serving REST on port "},
                               absl::Seconds(10));
  ASSERT_TRUE(lines.ok()) << lines.status();
  EXPECT_EQ(lines->at("serving gRPC on port "), "4242");
  EXPECT_EQ(lines->at("serving REST on port "), "80");
  kill(*ready, SIGKILL);
  waitpid(*ready, nullptr, 0);

  auto dies = SpawnDetached({{"/bin/sh", "-c", "echo 'cannot bind'; exit 3"}, {}}, log);
  ASSERT_TRUE(dies.ok());
  auto never = WaitForLogLines(*dies, log, {"serving gRPC on port "}, absl::Seconds(10));
  ASSERT_FALSE(never.ok());
  EXPECT_NE(never.status().message().find("cannot bind"), std::string::npos) << never.status();
  // The previous run's log is kept beside.
  EXPECT_TRUE(std::filesystem::exists(log + ".1"));
}

TEST_F(LocalClusterTest, TailOfFileKeepsTheLastLines) {
  const std::string path = dir_ + "/lines";
  std::ofstream(path) << "a\nb\nc\n";
  EXPECT_EQ(TailOfFile(path, 2), "b\nc\n");
  EXPECT_EQ(TailOfFile(path, 5), "a\nb\nc\n");
  EXPECT_EQ(TailOfFile(dir_ + "/missing", 2), "");
}

}  // namespace
}  // namespace gradhub::cli
