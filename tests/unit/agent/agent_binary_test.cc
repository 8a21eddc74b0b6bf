// gradhub-agent as a process, without a server: flags, SIGTERM, and step 1 (leftovers).
// Against a real gradhub-api it is tested end to end under tests/e2e.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>

#include "absl/time/clock.h"
#include "gpu_worker/agent/leftovers.h"
#include "tests/support/subprocess.h"

namespace gradhub::agent {
namespace {

using testing::BinaryPath;

TEST(AgentBinaryTest, HelpListsEveryFlagWithItsVariable) {
  const auto result =
      testing::Run({BinaryPath("gradhub-agent"), "--help"}, {}, std::chrono::seconds(30));
  EXPECT_EQ(result.exit_code, 0) << result.err;
  for (const char* text :
       {"--server", "GRADHUB_SERVER", "localhost:7070", "--token", "GRADHUB_NODE_TOKEN", "--name",
        "GRADHUB_NODE_NAME", "--slots", "GRADHUB_SLOTS", "--labels", "--address", "route to",
        "--work-dir", "--checkpoint-root", "--trainer", "gradhub-trainer", "--stop-grace", "10s"}) {
    EXPECT_NE(result.out.find(text), std::string::npos) << text << " missing in\n" << result.out;
  }
  EXPECT_NE(result.out.find("GRADHUB_FAKE_GPUS"), std::string::npos) << result.out;
}

TEST(AgentBinaryTest, BadFlagsAreUsageErrors) {
  EXPECT_EQ(testing::Run({BinaryPath("gradhub-agent"), "--no-such-flag"}).exit_code, 2);
  EXPECT_EQ(testing::Run({BinaryPath("gradhub-agent"), "--slots", "0"}).exit_code, 2);
  EXPECT_EQ(testing::Run({BinaryPath("gradhub-agent"), "--labels", "oops"}).exit_code, 2);
  EXPECT_EQ(testing::Run({BinaryPath("gradhub-agent"), "--fake-gpus", "-1"}).exit_code, 2);
}

// Each rank gets a GPU of its own, so a GPU node has at most one slot per GPU.
TEST(AgentBinaryTest, RefusesMoreSlotsThanGpus) {
  const auto result =
      testing::Run({BinaryPath("gradhub-agent"), "--fake-gpus", "2", "--slots", "3"});
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_NE(result.err.find("--slots: 3 is more than this node's 2 GPU(s)"), std::string::npos)
      << result.err;
}

// Ranks never run as root, and a rank user that could not enter its directory is found at
// start, not at the first rank.
TEST(AgentBinaryTest, RefusesRootRanksAndAWorkDirTheRankUserCannotEnter) {
  const auto root = testing::Run({BinaryPath("gradhub-agent"), "--run-as", "root"});
  EXPECT_EQ(root.exit_code, 2);
  EXPECT_NE(root.err.find("ranks never run as root"), std::string::npos) << root.err;
  if (geteuid() != 0) return;
  testing::TempDir dir;  // 0700, root's
  const auto closed = testing::Run(
      {BinaryPath("gradhub-agent"), "--work-dir", dir.path() + "/work", "--run-as", "nobody"});
  EXPECT_EQ(closed.exit_code, 2);
  EXPECT_NE(closed.err.find("cannot enter " + dir.path()), std::string::npos) << closed.err;
}

// Step 1 happens before registering, so it is visible without a server; the server being
// unreachable is retried, never fatal; SIGTERM ends the agent with 0.
TEST(AgentBinaryTest, KillsLeftoversKeepsRetryingAndExitsZeroOnSigterm) {
  testing::TempDir dir;
  chmod(dir.path().c_str(), 0711);  // a root agent's rank user must be able to enter it
  testing::Subprocess leftover({"/bin/sleep", "1000"});
  std::filesystem::create_directories(dir.path() + "/pids");
  ASSERT_TRUE(WritePidFile(dir.path() + "/pids/old.1.0.pid", leftover.pid()));

  testing::Subprocess agent({BinaryPath("gradhub-agent"), "--server", "127.0.0.1:1", "--token", "t",
                             "--name", "test-node", "--work-dir", dir.path()});
  EXPECT_EQ(leftover.Wait(std::chrono::seconds(10)), 128 + SIGKILL) << agent.err();
  // The agent removes the pid file after the kill: give it a moment under load.
  for (int i = 0; i < 100 && std::filesystem::exists(dir.path() + "/pids/old.1.0.pid"); ++i) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_FALSE(std::filesystem::exists(dir.path() + "/pids/old.1.0.pid"));
  absl::SleepFor(absl::Seconds(1));  // a few RegisterNode attempts
  EXPECT_TRUE(agent.running()) << agent.err();
  agent.Kill(SIGTERM);
  EXPECT_EQ(agent.Wait(std::chrono::seconds(10)), 0) << agent.err();
  EXPECT_NE(agent.err().find("RegisterNode at 127.0.0.1:1 failed"), std::string::npos)
      << agent.err();
  EXPECT_NE(agent.err().find("killed 1 trainer(s) left by a previous agent"), std::string::npos)
      << agent.err();
}

}  // namespace
}  // namespace gradhub::agent
