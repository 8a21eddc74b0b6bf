// The agent's half of node isolation: which user a rank runs as and which memory mechanism
// holds it (pure rules, one test each), then real ranks started as that user, inside a memory
// cgroup or under RLIMIT_DATA (these need root and skip without it).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "gpu_worker/agent/memory_limit.h"
#include "gpu_worker/agent/rank_launch.h"
#include "gpu_worker/agent/rank_process.h"
#include "gpu_worker/agent/rank_user.h"
#include "tests/support/subprocess.h"

namespace gradhub::agent {
namespace {

using ::testing::HasSubstr;

// ------------------------------------------------------------------------------------------
// Which user (rank_user.h)

const UserRecord kRankUser = {"gradhub-rank", 999, 995};

TEST(RankUserTest, ARootAgentRunsRanksAsTheDefaultUser) {
  auto identity = DecideRankIdentity(0, "root", "", kRankUser);
  ASSERT_TRUE(identity.ok()) << identity.status();
  EXPECT_TRUE(identity->switch_user);
  EXPECT_EQ(identity->uid, 999u);
  EXPECT_EQ(identity->gid, 995u);
  EXPECT_EQ(RankUserName(""), "gradhub-rank");
}

TEST(RankUserTest, ARootAgentRunsRanksAsTheNamedUser) {
  auto identity = DecideRankIdentity(0, "root", "trainer", UserRecord{"trainer", 1234, 1234});
  ASSERT_TRUE(identity.ok());
  EXPECT_EQ(identity->name, "trainer");
  EXPECT_EQ(RankUserName("trainer"), "trainer");
}

TEST(RankUserTest, RootIsRefusedByNameUidAndGroup) {
  EXPECT_THAT(DecideRankIdentity(0, "root", "root", UserRecord{"root", 0, 0}).status().message(),
              HasSubstr("--run-as"));
  EXPECT_FALSE(DecideRankIdentity(0, "root", "toor", UserRecord{"toor", 0, 5}).ok());
  EXPECT_FALSE(DecideRankIdentity(0, "root", "wheel", UserRecord{"wheel", 5, 0}).ok());
  EXPECT_FALSE(DecideRankIdentity(1000, "me", "root", std::nullopt).ok());
}

TEST(RankUserTest, AMissingUserIsRefusedWithTheWayToCreateIt) {
  const auto missing = DecideRankIdentity(0, "root", "", std::nullopt);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(missing.status().message(), HasSubstr("make setup"));
}

TEST(RankUserTest, ANonRootAgentRunsRanksAsItself) {
  auto identity = DecideRankIdentity(1000, "alice", "", std::nullopt);
  ASSERT_TRUE(identity.ok());
  EXPECT_FALSE(identity->switch_user);
  EXPECT_TRUE(DecideRankIdentity(1000, "alice", "alice", std::nullopt).ok());
  EXPECT_THAT(DecideRankIdentity(1000, "alice", "bob", std::nullopt).status().message(),
              HasSubstr("only an agent running as root"));
}

TEST(RankUserTest, TraversableNeedsASearchBitOnEveryAncestor) {
  testing::TempDir dir;
  const std::string inner = dir.path() + "/a/b";
  std::filesystem::create_directories(inner);
  chmod(dir.path().c_str(), 0711);
  chmod((dir.path() + "/a").c_str(), 0700);
  std::string blocked;
  EXPECT_FALSE(Traversable(inner, 999, 995, &blocked));
  EXPECT_EQ(blocked, dir.path() + "/a");
  chmod((dir.path() + "/a").c_str(), 0711);
  EXPECT_TRUE(Traversable(inner + "/not-yet", 999, 995, &blocked));
}

// ------------------------------------------------------------------------------------------
// Which memory mechanism (memory_limit.h)

TEST(MemoryMechanismTest, AutoPrefersCgroupV2ThenV1ThenTheRlimit) {
  EXPECT_EQ(*ChooseMemoryMechanism("auto", 1 << 30, {"/sys/fs/cgroup", "/v1"}),
            MemoryMechanism::kCgroupV2);
  EXPECT_EQ(*ChooseMemoryMechanism("auto", 1 << 30, {"", "/v1"}), MemoryMechanism::kCgroupV1);
  EXPECT_EQ(*ChooseMemoryMechanism("auto", 1 << 30, {"", ""}), MemoryMechanism::kRlimit);
}

TEST(MemoryMechanismTest, NoLimitMeansNoMechanism) {
  EXPECT_EQ(*ChooseMemoryMechanism("auto", 0, {"/sys/fs/cgroup", ""}), MemoryMechanism::kNone);
  EXPECT_EQ(*ChooseMemoryMechanism("none", 1 << 30, {"/sys/fs/cgroup", ""}),
            MemoryMechanism::kNone);
}

TEST(MemoryMechanismTest, AnExplicitMechanismMustExistHere) {
  EXPECT_EQ(*ChooseMemoryMechanism("rlimit", 1 << 30, {"/sys/fs/cgroup", "/v1"}),
            MemoryMechanism::kRlimit);
  EXPECT_EQ(*ChooseMemoryMechanism("cgroup-v1", 1 << 30, {"/v2", "/v1"}),
            MemoryMechanism::kCgroupV1);
  auto missing = ChooseMemoryMechanism("cgroup-v2", 1 << 30, {"", "/v1"});
  EXPECT_THAT(missing.status().message(), HasSubstr("--memory-isolation"));
  EXPECT_FALSE(ChooseMemoryMechanism("cgroups", 1 << 30, {"", ""}).ok());
}

TEST(MemoryMechanismTest, OomKillsAreReadFromEitherVersionsFile) {
  EXPECT_EQ(ParseOomKills("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n"), 3);  // v1
  EXPECT_EQ(ParseOomKills("low 0\nhigh 0\nmax 7\noom 2\noom_kill 1\n"), 1);      // v2
  EXPECT_EQ(ParseOomKills("oom_kill_disable 0\nunder_oom 0\n"), 0);  // kernels before 4.13
}

// ------------------------------------------------------------------------------------------
// Real ranks

// The user the tests start ranks as: the agent's default when `make setup` made it.
std::optional<RankIdentity> TestRankUser() {
  if (geteuid() != 0) return std::nullopt;
  for (const char* name : {"gradhub-rank", "nobody"}) {
    auto identity = ResolveRankIdentity(name);
    if (identity.ok()) return *identity;
  }
  return std::nullopt;
}

struct Finished {
  RankProcessStatus status;
  std::string out;
};

Finished RunShell(const std::string& script, RankProcessOptions options) {
  options.argv = {"/bin/sh", "-c", script};
  auto out = std::make_shared<std::string>();
  auto mu = std::make_shared<std::mutex>();
  options.on_line = [out, mu](const OutputLine& line) {
    std::lock_guard<std::mutex> lock(*mu);
    *out += line.text + "\n";
  };
  auto process = RankProcess::Start(std::move(options));
  EXPECT_TRUE(process.ok()) << process.status();
  if (!process.ok()) return {};
  EXPECT_TRUE((*process)->Wait(absl::Seconds(60)));
  std::lock_guard<std::mutex> lock(*mu);
  return {(*process)->Status(), *out};
}

TEST(MemoryMechanismTest, AnAgentsCgroupIsItsOwnAcrossRestartsAndNoOtherAgents) {
  const std::string name = AgentCgroupName("a", "/var/lib/gradhub/agent");
  EXPECT_EQ(name, AgentCgroupName("a", "/var/lib/gradhub/agent"));  // a restarted agent
  EXPECT_EQ(name.rfind("gradhub-agent-a-", 0), 0u) << name;
  // Another cluster's agent of the same name on this machine (tests side by side).
  EXPECT_NE(name, AgentCgroupName("a", "/tmp/other-cluster/agent-a"));
  EXPECT_NE(name, AgentCgroupName("b", "/var/lib/gradhub/agent"));
}

TEST(RankIsolationTest, ARankRunsAsItsUserWithoutSupplementaryGroupsOrAWayBack) {
  const auto user = TestRankUser();
  if (!user) GTEST_SKIP() << "needs root and a rank user";
  testing::TempDir dir;
  const std::string secret = dir.path() + "/secret";
  std::ofstream(secret) << "root only\n";
  chmod(secret.c_str(), 0600);
  chmod(dir.path().c_str(), 0711);
  RankProcessOptions options;
  options.identity = *user;
  const Finished done = RunShell("grep -E '^(Uid|Gid|Groups|NoNewPrivs):' /proc/self/status; cat " +
                                     secret + " >/dev/null 2>&1 && echo READ || echo DENIED",
                                 std::move(options));
  const std::string uid = std::to_string(user->uid), gid = std::to_string(user->gid);
  EXPECT_THAT(done.out, HasSubstr("Uid:\t" + uid + "\t" + uid + "\t" + uid + "\t" + uid));
  EXPECT_THAT(done.out, HasSubstr("Gid:\t" + gid + "\t" + gid + "\t" + gid + "\t" + gid));
  EXPECT_THAT(done.out, ::testing::ContainsRegex("Groups:[ \t]*\n"));  // none
  EXPECT_THAT(done.out, HasSubstr("NoNewPrivs:\t1"));
  EXPECT_THAT(done.out, HasSubstr("DENIED"));
  EXPECT_EQ(done.status.exit_code, 0);
}

TEST(RankIsolationTest, RankFilesBelongToTheRankUser) {
  const auto user = TestRankUser();
  if (!user) GTEST_SKIP() << "needs root and a rank user";
  testing::TempDir dir;
  AgentConfig config;
  config.work_dir = dir.path();
  config.trainer = "/bin/true";
  v1::RankAssignment assignment;
  assignment.set_job("jobs/0b7c7a4e-1f4e-4d1c-9a57-2f0c1b1d3e55");
  assignment.set_attempt(1);
  PreparedRank prepared;
  prepared.identity = *user;
  prepared.token = "s";
  auto launch = PlanRankLaunch(config, assignment, prepared);
  ASSERT_TRUE(launch.ok());
  ASSERT_TRUE(PrepareRankFiles(*launch, assignment, *user).ok());
  for (const std::string& path : {launch->dir, launch->spec_path, launch->checkpoint_dir}) {
    struct stat info;
    ASSERT_EQ(stat(path.c_str(), &info), 0) << path;
    EXPECT_EQ(info.st_uid, user->uid) << path;
    EXPECT_EQ(info.st_mode & 077, 0u) << path;  // no other rank's user reads them
  }
}

// A process that keeps allocating (and touching) memory, 16 MiB at a time, up to 2 GiB.
constexpr char kAllocate[] =
    "exec python3 -c 'import sys\nb=[]\nfor i in range(128): b.append(bytearray(16<<20))\n"
    "print(\"allocated\")'";

TEST(RankIsolationTest, TheKernelStopsARankAtItsCgroupLimit) {
  const CgroupProbe probe = ProbeCgroups("");
  auto mechanism = ChooseMemoryMechanism("auto", 1, probe);
  if (geteuid() != 0 || !mechanism.ok() || *mechanism == MemoryMechanism::kRlimit) {
    GTEST_SKIP() << "needs root and a writable memory cgroup";
  }
  const std::string parent =
      *mechanism == MemoryMechanism::kCgroupV2 ? probe.v2_parent : probe.v1_parent;
  auto dir = PrepareAgentCgroup(*mechanism, parent,
                                AgentCgroupName("isolation-test", std::to_string(getpid())));
  ASSERT_TRUE(dir.ok()) << dir.status();
  constexpr int64_t kLimit = 96 << 20;
  auto cgroup = MemoryCgroup::Create(*mechanism, *dir, "rank", kLimit);
  ASSERT_TRUE(cgroup.ok()) << cgroup.status();
  const std::string path = (*cgroup)->path();
  RankProcessOptions options;
  options.memory_cgroup = *std::move(cgroup);
  if (auto user = TestRankUser()) options.identity = *user;
  const absl::Time start = absl::Now();
  const Finished done = RunShell(kAllocate, std::move(options));
  const absl::Duration took = absl::Now() - start;
  EXPECT_TRUE(done.status.out_of_memory) << done.out;
  EXPECT_EQ(done.status.signal, SIGKILL);
  EXPECT_EQ(done.status.memory_limit_bytes, kLimit);
  EXPECT_GE(done.status.memory_peak_bytes, kLimit * 9 / 10);
  EXPECT_LT(took, absl::Seconds(10));
  std::cerr << "cgroup " << MemoryMechanismName(*mechanism) << ": stopped after "
            << absl::FormatDuration(took) << ", peak " << done.status.memory_peak_bytes
            << " bytes\n";
  EXPECT_FALSE(std::filesystem::exists(path)) << "the rank's cgroup is removed after it exits";
  EXPECT_EQ(rmdir(dir->c_str()), 0);
}

TEST(RankIsolationTest, UnderTheRlimitAnAllocationFailsInsteadOfGrowing) {
  RankProcessOptions options;
  options.rlimit_data_bytes = 96 << 20;
  if (auto user = TestRankUser()) options.identity = *user;
  const Finished done = RunShell(
      "grep 'Max data size' /proc/self/limits; " + std::string(kAllocate), std::move(options));
  EXPECT_THAT(done.out, HasSubstr(std::to_string(96 << 20)));
  EXPECT_THAT(done.out, HasSubstr("MemoryError"));
  EXPECT_FALSE(done.status.out_of_memory);  // no cgroup: the process itself says so
  EXPECT_EQ(done.status.memory_limit_bytes, 96 << 20);
  EXPECT_NE(done.status.exit_code, 0);
}

}  // namespace
}  // namespace gradhub::agent
