#include "gpu_worker/agent/rank_process.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gpu_worker/agent/leftovers.h"
#include "tests/support/subprocess.h"

namespace gradhub::agent {
namespace {

// Collects a RankProcess's lines.
class Lines {
 public:
  LineCallback callback() {
    return [this](const OutputLine& line) {
      std::lock_guard<std::mutex> lock(mu_);
      lines_.push_back(line);
    };
  }
  std::vector<OutputLine> get() const {
    std::lock_guard<std::mutex> lock(mu_);
    return lines_;
  }
  // Waits for a line with `text`; returns it, or an OutputLine with seq 0 after `timeout`.
  OutputLine WaitFor(const std::string& text, absl::Duration timeout = absl::Seconds(10)) const {
    const absl::Time deadline = absl::Now() + timeout;
    while (absl::Now() < deadline) {
      for (const OutputLine& line : get()) {
        if (line.text == text) return line;
      }
      absl::SleepFor(absl::Milliseconds(10));
    }
    return {};
  }
  // The first line, waiting for it.
  std::string First(absl::Duration timeout = absl::Seconds(10)) const {
    const absl::Time deadline = absl::Now() + timeout;
    while (absl::Now() < deadline) {
      auto lines = get();
      if (!lines.empty()) return lines[0].text;
      absl::SleepFor(absl::Milliseconds(10));
    }
    return "";
  }

 private:
  mutable std::mutex mu_;
  std::vector<OutputLine> lines_;
};

std::unique_ptr<RankProcess> StartShell(const std::string& script, Lines* lines,
                                        RankProcessOptions options = {}) {
  options.argv = {"/bin/sh", "-c", script};
  if (lines != nullptr) options.on_line = lines->callback();
  auto process = RankProcess::Start(std::move(options));
  EXPECT_TRUE(process.ok()) << process.status();
  return process.ok() ? *std::move(process) : nullptr;
}

bool GoneWithin(pid_t pid, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (ProcessGone(pid)) return true;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return ProcessGone(pid);
}

pid_t ParsePid(const std::string& text) {
  int pid = 0;
  EXPECT_TRUE(absl::SimpleAtoi(text, &pid)) << "'" << text << "'";
  return pid;
}

TEST(RankProcessTest, CapturesBothStreamsInOrderWithSeqs) {
  Lines lines;
  const absl::Time before = absl::Now();
  // The sleeps order the writes across the two pipes; within a pipe order is guaranteed.
  auto process = StartShell(
      "echo first; sleep 0.3; echo 'to stderr' >&2; sleep 0.3; echo third; sleep 0.3; "
      "printf 'no newline' >&2",
      &lines);
  ASSERT_TRUE(process->Wait(absl::Seconds(10)));
  const auto got = lines.get();
  ASSERT_EQ(got.size(), 4u);
  const std::vector<std::pair<OutputStream, std::string>> want = {
      {OutputStream::kStdout, "first"},
      {OutputStream::kStderr, "to stderr"},
      {OutputStream::kStdout, "third"},
      {OutputStream::kStderr, "no newline"}};
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].seq, static_cast<int64_t>(i + 1));
    EXPECT_EQ(got[i].stream, want[i].first) << i;
    EXPECT_EQ(got[i].text, want[i].second);
    EXPECT_GE(got[i].time, before);
    EXPECT_LE(got[i].time, absl::Now());
  }
  const RankProcessStatus status = process->Status();
  EXPECT_TRUE(status.exited);
  EXPECT_EQ(status.state, RankState::kSucceeded);
  EXPECT_EQ(status.exit_code, 0);
  EXPECT_EQ(status.last_stderr_line, "no newline");
}

TEST(RankProcessTest, ManyLinesHaveConsecutiveSeqs) {
  Lines lines;
  auto process = StartShell(
      "i=0; while [ $i -lt 2000 ]; do echo line$i; i=$((i+1)); done; "
      "echo err >&2",
      &lines);
  ASSERT_TRUE(process->Wait(absl::Seconds(20)));
  const auto got = lines.get();
  ASSERT_EQ(got.size(), 2001u);
  int stdout_index = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].seq, static_cast<int64_t>(i + 1));
    if (got[i].stream == OutputStream::kStdout) {
      EXPECT_EQ(got[i].text, "line" + std::to_string(stdout_index++));
    }
  }
  EXPECT_EQ(stdout_index, 2000);
}

TEST(RankProcessTest, SplitsLongLines) {
  Lines lines;
  auto process = StartShell("head -c 150000 /dev/zero | tr '\\0' a; echo; echo after", &lines);
  ASSERT_TRUE(process->Wait(absl::Seconds(10)));
  const auto got = lines.get();
  ASSERT_EQ(got.size(), 4u);
  EXPECT_EQ(got[0].text, std::string(kMaxLineBytes, 'a'));
  EXPECT_EQ(got[1].text, std::string(kMaxLineBytes, 'a'));
  EXPECT_EQ(got[2].text, std::string(150000 - 2 * kMaxLineBytes, 'a'));
  EXPECT_EQ(got[3].text, "after");
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i].seq, static_cast<int64_t>(i + 1));
}

TEST(RankProcessTest, SanitizeAndSplitKeepsCharactersWholeAndReplacesInvalidBytes) {
  std::string euros;
  for (int i = 0; i < 30000; ++i) euros += "\xE2\x82\xAC";  // U+20AC, 3 bytes
  const auto pieces = SanitizeAndSplitLine(euros);
  ASSERT_EQ(pieces.size(), 2u);
  EXPECT_EQ(pieces[0].size(), kMaxLineBytes - kMaxLineBytes % 3);
  EXPECT_EQ(pieces[0].size() + pieces[1].size(), euros.size());
  EXPECT_EQ(pieces[1].size() % 3, 0u);

  EXPECT_EQ(SanitizeAndSplitLine("ok \xFF\xC3(\xED\xA0\x80 \xF0\x9F\x98\x80"),
            std::vector<std::string>{"ok \xEF\xBF\xBD\xEF\xBF\xBD(\xEF\xBF\xBD\xEF\xBF\xBD"
                                     "\xEF\xBF\xBD \xF0\x9F\x98\x80"});
  EXPECT_EQ(SanitizeAndSplitLine(""), std::vector<std::string>{""});
  EXPECT_EQ(SanitizeAndSplitLine("abcdefgh", 4), (std::vector<std::string>{"abcd", "efgh"}));
}

TEST(RankProcessTest, InvalidUtf8OnAPipeArrivesSanitized) {
  Lines lines;
  auto process = StartShell("printf 'bad \\377 byte\\n'", &lines);
  ASSERT_TRUE(process->Wait(absl::Seconds(10)));
  ASSERT_EQ(lines.get().size(), 1u);
  EXPECT_EQ(lines.get()[0].text, "bad \xEF\xBF\xBD byte");
}

TEST(RankProcessTest, RecordsExitCodeSignalAndLastStderrLine) {
  auto failed = StartShell("echo first >&2; echo boom >&2; echo out; exit 12", nullptr);
  auto killed = StartShell("kill -9 $$", nullptr);
  auto succeeded = StartShell("exit 0", nullptr);
  ASSERT_TRUE(failed->Wait(absl::Seconds(10)));
  ASSERT_TRUE(killed->Wait(absl::Seconds(10)));
  ASSERT_TRUE(succeeded->Wait(absl::Seconds(10)));

  RankProcessStatus status = failed->Status();
  EXPECT_EQ(status.state, RankState::kFailed);
  EXPECT_EQ(status.exit_code, 12);
  EXPECT_EQ(status.signal, 0);
  EXPECT_EQ(status.last_stderr_line, "boom");
  EXPECT_EQ(status.pid, failed->pid());

  status = killed->Status();
  EXPECT_EQ(status.state, RankState::kFailed);
  EXPECT_EQ(status.signal, SIGKILL);
  EXPECT_EQ(status.exit_code, 0);

  status = succeeded->Status();
  EXPECT_EQ(status.state, RankState::kSucceeded);
  EXPECT_EQ(status.exit_code, 0);
  EXPECT_EQ(status.signal, 0);
}

TEST(RankProcessTest, ExecFailureIsExit127WithReason) {
  RankProcessOptions options;
  options.argv = {"/nonexistent/gradhub-trainer"};
  auto process = RankProcess::Start(options);
  ASSERT_TRUE(process.ok()) << process.status();
  ASSERT_TRUE((*process)->Wait(absl::Seconds(10)));
  const RankProcessStatus status = (*process)->Status();
  EXPECT_EQ(status.state, RankState::kFailed);
  EXPECT_EQ(status.exit_code, 127);
  EXPECT_NE(status.last_stderr_line.find("cannot exec /nonexistent/gradhub-trainer"),
            std::string::npos)
      << status.last_stderr_line;
}

TEST(RankProcessTest, ProgressLinesUpdateLastStep) {
  Lines lines;
  auto process = StartShell(
      "sleep 0.3; echo '{\"event\":\"progress\",\"step\":40,\"epoch\":0,\"loss\":0.5}'; "
      "echo 'step 99 is not json'; echo '{\"event\":\"eval\",\"loss\":0.1}'; echo ready; "
      "sleep 0.3; echo '{\"event\":\"done\",\"rank\":0,\"step\":50}'",
      &lines);
  EXPECT_EQ(process->Status().state, RankState::kStarting);
  EXPECT_EQ(process->Status().last_step, 0);
  EXPECT_EQ(process->Status().last_step_time, absl::InfinitePast());
  ASSERT_NE(lines.WaitFor("ready").seq, 0);
  RankProcessStatus status = process->Status();
  EXPECT_EQ(status.state, RankState::kRunning);
  EXPECT_EQ(status.last_step, 40);
  EXPECT_EQ(status.last_step_time, lines.get()[0].time);
  ASSERT_TRUE(process->Wait(absl::Seconds(10)));
  status = process->Status();
  EXPECT_EQ(status.last_step, 50);
  EXPECT_EQ(status.last_step_time, lines.get().back().time);
  EXPECT_EQ(status.state, RankState::kSucceeded);
}

TEST(RankProcessTest, StopSendsSigtermToAProcessThatHonoursIt) {
  auto process = StartShell("exec sleep 1000", nullptr);
  const absl::Time start = absl::Now();
  process->Stop(absl::Seconds(20));
  ASSERT_TRUE(process->Wait(absl::Seconds(10)));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  const RankProcessStatus status = process->Status();
  EXPECT_EQ(status.state, RankState::kStopped);
  EXPECT_EQ(status.signal, SIGTERM);
}

TEST(RankProcessTest, StopEscalatesToSigkillAfterTheGrace) {
  Lines lines;
  auto process = StartShell("trap '' TERM; echo ready; while :; do sleep 0.05; done", &lines);
  ASSERT_NE(lines.WaitFor("ready").seq, 0);
  const absl::Time start = absl::Now();
  process->Stop(absl::Milliseconds(700));
  EXPECT_FALSE(process->Wait(absl::Milliseconds(500))) << "SIGTERM was supposed to be ignored";
  ASSERT_TRUE(process->Wait(absl::Seconds(10)));
  const absl::Duration took = absl::Now() - start;
  EXPECT_GE(took, absl::Milliseconds(700));
  EXPECT_LT(took, absl::Seconds(5));
  const RankProcessStatus status = process->Status();
  EXPECT_EQ(status.state, RankState::kStopped);
  EXPECT_EQ(status.signal, SIGKILL);
  // Idempotent once exited.
  process->Stop(absl::ZeroDuration());
  EXPECT_EQ(process->Status().state, RankState::kStopped);
}

// Whether a SIGTERM went before the SIGKILL cannot be seen from here: the SIGKILL follows
// within microseconds, before any handler of the process could run (checked: the same test
// passes when Stop sends both). What it checks is the rest of the contract.
TEST(RankProcessTest, StopWithoutAGraceSigkillsAtOnce) {
  Lines lines;
  auto process = StartShell("trap '' TERM; echo ready; while :; do sleep 0.05; done", &lines);
  ASSERT_NE(lines.WaitFor("ready").seq, 0);
  const absl::Time start = absl::Now();
  process->Stop(absl::ZeroDuration());
  ASSERT_TRUE(process->Wait(absl::Seconds(5)));
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  const RankProcessStatus status = process->Status();
  EXPECT_EQ(status.state, RankState::kStopped);
  EXPECT_EQ(status.signal, SIGKILL);
}

TEST(RankProcessTest, ASecondStopWithoutAGraceCutsTheGraceShort) {
  Lines lines;
  auto process = StartShell("trap '' TERM; echo ready; while :; do sleep 0.05; done", &lines);
  ASSERT_NE(lines.WaitFor("ready").seq, 0);
  const absl::Time start = absl::Now();
  process->Stop(absl::Seconds(60));
  EXPECT_FALSE(process->Wait(absl::Milliseconds(300))) << "SIGTERM was supposed to be ignored";
  process->Stop(absl::ZeroDuration());
  ASSERT_TRUE(process->Wait(absl::Seconds(5)));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_EQ(process->Status().signal, SIGKILL);
}

TEST(RankProcessTest, StopKillsTheWholeProcessGroup) {
  Lines lines;
  auto process = StartShell("sleep 1000 & echo $!; wait", &lines);
  const pid_t grandchild = ParsePid(lines.First());
  ASSERT_GT(grandchild, 0);
  ASSERT_FALSE(ProcessGone(grandchild));
  process->Stop(absl::Seconds(2));
  ASSERT_TRUE(process->Wait(absl::Seconds(10)));
  EXPECT_TRUE(GoneWithin(grandchild, absl::Seconds(1)));
}

TEST(RankProcessTest, WhatARankLeavesBehindIsKilledWhenItExits) {
  Lines lines;
  auto process = StartShell("sleep 1000 & echo $!; exit 3", &lines);
  ASSERT_TRUE(process->Wait(absl::Seconds(10)));  // not held up by the sleep's copy of stdout
  ASSERT_EQ(lines.get().size(), 1u);
  const pid_t grandchild = ParsePid(lines.get()[0].text);
  EXPECT_TRUE(GoneWithin(grandchild, absl::Seconds(1)));
  EXPECT_EQ(process->Status().state, RankState::kFailed);
  EXPECT_EQ(process->Status().exit_code, 3);
}

TEST(RankProcessTest, EnvironmentAndWorkingDirectory) {
  testing::TempDir dir;
  setenv("OMP_AGENT_TEST_INHERITED", "from-agent", 1);
  setenv("OMP_AGENT_TEST_OVERRIDDEN", "from-agent", 1);
  setenv("GRADHUB_AGENT_TEST_SECRET", "agent-secret", 1);
  RankProcessOptions options;
  options.env = {{"OMP_AGENT_TEST_OVERRIDDEN", "from-options"}, {"EXTRA", "x y"}};
  options.working_dir = dir.path();
  Lines lines;
  auto process = StartShell(
      "pwd; echo $OMP_AGENT_TEST_INHERITED; echo $OMP_AGENT_TEST_OVERRIDDEN; "
      "echo \"$EXTRA\"; echo \"secret=$GRADHUB_AGENT_TEST_SECRET\"; [ -t 0 ] || cat; echo end",
      &lines, options);
  ASSERT_TRUE(process->Wait(absl::Seconds(10)));
  std::vector<std::string> texts;
  for (const auto& line : lines.get()) texts.push_back(line.text);
  EXPECT_EQ(texts, (std::vector<std::string>{std::filesystem::canonical(dir.path()).string(),
                                             "from-agent", "from-options", "x y", "secret=",
                                             "end"}));  // stdin is /dev/null: cat ends at once
}

TEST(RankProcessTest, RanksInheritOnlyWhatFindsProgramsAndTunesThem) {
  for (const char* name : {"PATH", "LD_LIBRARY_PATH", "LC_ALL", "OMP_NUM_THREADS",
                           "NCCL_SOCKET_IFNAME", "CUDA_MODULE_LOADING", "GRADHUB_THREADS"}) {
    EXPECT_TRUE(RankInheritsVariable(name)) << name;
  }
  for (const char* name : {"GRADHUB_TOKEN", "GRADHUB_NODE_TOKEN", "GRADHUB_DATABASE_URL",
                           "AWS_SECRET_ACCESS_KEY", "HOME", "PATHX", "LD_PRELOAD", "OMP"}) {
    EXPECT_FALSE(RankInheritsVariable(name)) << name;
  }
}

TEST(RankProcessTest, NoLineCallbackAfterDestruction) {
  std::atomic<int> calls{0};
  std::atomic<bool> destroyed{false};
  std::atomic<bool> late{false};
  RankProcessOptions options;
  options.argv = {"/bin/sh", "-c", "while :; do echo spam; done"};
  options.on_line = [&](const OutputLine&) {
    if (destroyed) late = true;
    ++calls;
  };
  auto process = RankProcess::Start(options);
  ASSERT_TRUE(process.ok());
  while (calls < 100) absl::SleepFor(absl::Milliseconds(1));
  const pid_t pid = (*process)->pid();
  process->reset();
  destroyed = true;
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_FALSE(late);
  EXPECT_TRUE(GoneWithin(pid, absl::Seconds(2)));
}

// PR_SET_PDEATHSIG: when the agent dies, its rank processes die with it. The test makes itself
// a child subreaper, so the orphaned rank becomes its child and its end can be observed
// exactly (with waitpid) rather than guessed.
TEST(RankProcessTest, RankDiesWithItsAgent) {
  ASSERT_EQ(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  {
    testing::Subprocess helper(
        {testing::BinaryPath("agent_pdeathsig_helper"), "/bin/sleep", "1000"});
    std::string out;
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (out.find('\n') == std::string::npos && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(10));
      out = helper.out();
    }
    const pid_t rank = ParsePid(std::string(absl::StripSuffix(out, "\n")));
    ASSERT_GT(rank, 0);
    ASSERT_FALSE(ProcessGone(rank));
    // Killed before the rank armed PR_SET_PDEATHSIG, the rank would end by its own check
    // (exit 127), not by the signal this test is about: wait until it runs /bin/sleep, after
    // the prctl. (Under load on a clean clone, the kill once came first.)
    std::string comm;
    while (absl::Now() < deadline) {
      std::getline(std::ifstream(absl::StrCat("/proc/", rank, "/comm")), comm);
      if (comm == "sleep") break;
      absl::SleepFor(absl::Milliseconds(5));
    }
    ASSERT_EQ(comm, "sleep") << "the rank never reached exec";
    helper.Kill(SIGKILL);
    EXPECT_EQ(helper.Wait(std::chrono::seconds(5)), 128 + SIGKILL);
    const absl::Time killed = absl::Now();
    int status = 0;
    pid_t reaped = 0;
    while (reaped == 0 && absl::Now() - killed < absl::Seconds(1)) {
      reaped = waitpid(rank, &status, WNOHANG);
      if (reaped == 0) absl::SleepFor(absl::Milliseconds(5));
    }
    ASSERT_EQ(reaped, rank) << "the rank outlived its agent by a second";
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;
  }
  prctl(PR_SET_CHILD_SUBREAPER, 0);
}

// The agent blocks SIGTERM for its sigwait thread; a rank must not inherit that, or it could
// only ever be SIGKILLed.
TEST(RankProcessTest, RankStartsWithNoSignalsBlocked) {
  // grep itself, not through sh: dash clears its signal mask when it starts.
  testing::Subprocess helper({testing::BinaryPath("agent_pdeathsig_helper"), "/usr/bin/grep",
                              "SigBlk", "/proc/self/status"});
  std::string out;
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (out.find("SigBlk") == std::string::npos && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
    out = helper.out();
  }
  EXPECT_NE(out.find("SigBlk:\t0000000000000000"), std::string::npos) << out;
}

}  // namespace
}  // namespace gradhub::agent
