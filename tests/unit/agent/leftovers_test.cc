#include "gpu_worker/agent/leftovers.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <mutex>

#include "absl/strings/numbers.h"
#include "gpu_worker/agent/rank_process.h"
#include "tests/support/subprocess.h"

namespace gradhub::agent {
namespace {

namespace fs = std::filesystem;

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void WriteText(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
}

TEST(LeftoversTest, StartTimeAndBootId) {
  const auto mine = ProcessStartTime(getpid());
  ASSERT_TRUE(mine.has_value());
  EXPECT_GT(*mine, 0u);
  EXPECT_EQ(ProcessStartTime(getpid()), mine);
  EXPECT_FALSE(ProcessStartTime(0x7ffffff0).has_value());
  EXPECT_EQ(BootId().size(), 36u) << BootId();
  EXPECT_FALSE(ProcessGone(getpid()));
  EXPECT_TRUE(ProcessGone(0x7ffffff0));
}

TEST(LeftoversTest, KillsARecordedProcessThatIsStillTheSame) {
  testing::TempDir dir;
  testing::Subprocess victim({"/bin/sleep", "1000"});
  const std::string file = dir.path() + "/jobA.1.0.pid";
  ASSERT_TRUE(WritePidFile(file, victim.pid()));
  EXPECT_EQ(ReadAll(file), std::to_string(victim.pid()) + " " +
                               std::to_string(*ProcessStartTime(victim.pid())) + " " + BootId() +
                               "\n");
  const LeftoverReport report = KillLeftovers(dir.path());
  EXPECT_EQ(report.files, 1);
  EXPECT_EQ(report.killed, 1);
  EXPECT_EQ(report.skipped, 0);
  EXPECT_EQ(victim.Wait(std::chrono::seconds(5)), 128 + SIGKILL);
  EXPECT_FALSE(fs::exists(file));
}

TEST(LeftoversTest, RefusesAPidWhoseStartTimeOrBootDiffers) {
  testing::TempDir dir;
  testing::Subprocess bystander({"/bin/sleep", "1000"});
  const uint64_t start = *ProcessStartTime(bystander.pid());
  const std::string pid = std::to_string(bystander.pid());
  WriteText(dir.path() + "/reused.pid", pid + " " + std::to_string(start + 1) + " " + BootId());
  WriteText(dir.path() + "/rebooted.pid",
            pid + " " + std::to_string(start) + " 00000000-0000-0000-0000-000000000000");
  WriteText(dir.path() + "/garbage.pid", "not a pid file");
  WriteText(dir.path() + "/half-written.pid.tmp", pid);
  WriteText(dir.path() + "/unrelated.txt", pid);
  const LeftoverReport report = KillLeftovers(dir.path());
  EXPECT_EQ(report.files, 3);
  EXPECT_EQ(report.killed, 0);
  EXPECT_EQ(report.skipped, 3);
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_TRUE(bystander.running());
  EXPECT_FALSE(fs::exists(dir.path() + "/reused.pid"));
  EXPECT_FALSE(fs::exists(dir.path() + "/rebooted.pid"));
  EXPECT_FALSE(fs::exists(dir.path() + "/half-written.pid.tmp"));
  EXPECT_TRUE(fs::exists(dir.path() + "/unrelated.txt"));
}

TEST(LeftoversTest, MissingDirectoryIsNothingToDo) {
  const LeftoverReport report = KillLeftovers("/nonexistent/gradhub/pids");
  EXPECT_EQ(report.files, 0);
}

// The pid file a RankProcess writes is what KillLeftovers reads, and the group goes with the
// leader.
TEST(LeftoversTest, KillsTheProcessGroupOfARankFromItsPidFile) {
  testing::TempDir dir;
  const std::string file = dir.path() + "/job.1.0.pid";
  std::mutex mu;
  std::string first_line;
  RankProcessOptions options;
  options.argv = {"/bin/sh", "-c", "sleep 1000 & echo $!; wait"};
  options.pid_file = file;
  options.on_line = [&](const OutputLine& line) {
    std::lock_guard<std::mutex> lock(mu);
    if (first_line.empty()) first_line = line.text;
  };
  auto rank = RankProcess::Start(options);
  ASSERT_TRUE(rank.ok());
  int grandchild = 0;
  for (int i = 0; i < 1000 && grandchild == 0; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
    std::lock_guard<std::mutex> lock(mu);
    if (!first_line.empty()) {
      ASSERT_TRUE(absl::SimpleAtoi(first_line, &grandchild));
    }
  }
  ASSERT_GT(grandchild, 0);
  ASSERT_TRUE(fs::exists(file));
  EXPECT_EQ(ReadAll(file).rfind(std::to_string((*rank)->pid()) + " ", 0), 0u) << ReadAll(file);

  const LeftoverReport report = KillLeftovers(dir.path());
  EXPECT_EQ(report.killed, 1);
  ASSERT_TRUE((*rank)->Wait(absl::Seconds(5)));
  EXPECT_EQ((*rank)->Status().signal, SIGKILL);
  EXPECT_EQ((*rank)->Status().state, RankState::kFailed);  // not a stop the agent asked for
  for (int i = 0; i < 100 && !ProcessGone(grandchild); ++i) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_TRUE(ProcessGone(grandchild));
}

TEST(LeftoversTest, RankRemovesItsPidFileWhenReaped) {
  testing::TempDir dir;
  RankProcessOptions options;
  options.argv = {"/bin/sh", "-c", "sleep 0.2"};
  options.pid_file = dir.path() + "/job.1.0.pid";
  auto rank = RankProcess::Start(options);
  ASSERT_TRUE(rank.ok());
  EXPECT_TRUE(fs::exists(options.pid_file));
  ASSERT_TRUE((*rank)->Wait(absl::Seconds(5)));
  EXPECT_FALSE(fs::exists(options.pid_file));
}

}  // namespace
}  // namespace gradhub::agent
