// The rules of gpu_worker/agent/job_uids.h, one test each, then the parts that touch the node:
// the /proc scan (on a fake /proc), JobUids putting them together, and the files of a released
// job given to root.
#include "gpu_worker/agent/job_uids.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "tests/support/subprocess.h"

namespace gradhub::agent {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

constexpr UidRange kRange{1900000000, 1 << 20};
constexpr char kJob[] = "0b7c7a4e-1f4e-4d1c-9a57-2f0c1b1d3e55";

TEST(PreferredJobUid, IsTheSameForAJobAndWithinTheRange) {
  const uint32_t uid = PreferredJobUid(kJob, kRange);
  EXPECT_EQ(uid, PreferredJobUid(kJob, kRange));
  EXPECT_TRUE(kRange.Contains(uid));
  EXPECT_NE(uid, PreferredJobUid("another-job", kRange));
}

TEST(ChooseJobUid, Rule1AJobThatHoldsAUidKeepsIt) {
  // Even where its preferred uid is free now: every rank and attempt shares the one it holds.
  const std::map<uint32_t, std::string> holders = {{1900000007, kJob}, {1900000008, "other"}};
  EXPECT_EQ(ChooseJobUid(kJob, kRange, holders, {1900000007}).value(), 1900000007u);
}

TEST(ChooseJobUid, Rule2ANewJobGetsItsPreferredUidWhenFree) {
  EXPECT_EQ(ChooseJobUid(kJob, kRange, {}, {}).value(), PreferredJobUid(kJob, kRange));
}

TEST(ChooseJobUid, Rule2NeverAUidAnotherJobHolds) {
  const uint32_t preferred = PreferredJobUid(kJob, kRange);
  const std::map<uint32_t, std::string> holders = {{preferred, "other"}};
  EXPECT_EQ(ChooseJobUid(kJob, kRange, holders, {}).value(), preferred + 1);
}

TEST(ChooseJobUid, Rule2NeverAUidALeftoverProcessRunsAs) {
  // Held by no job the agent knows (a previous agent's leftover, say), but a process runs as it.
  const uint32_t preferred = PreferredJobUid(kJob, kRange);
  EXPECT_EQ(ChooseJobUid(kJob, kRange, {}, {preferred, preferred + 1}).value(), preferred + 2);
}

TEST(ChooseJobUid, Rule2WrapsAroundTheRange) {
  const UidRange four{5000, 4};
  const uint32_t preferred = PreferredJobUid(kJob, four);
  std::set<uint32_t> in_use;
  for (uint32_t uid = preferred; uid < 5004; ++uid) in_use.insert(uid);
  const absl::StatusOr<uint32_t> uid = ChooseJobUid(kJob, four, {}, in_use);
  ASSERT_TRUE(uid.ok()) << uid.status();
  EXPECT_GE(*uid, 5000u);
  EXPECT_LT(*uid, preferred);
}

TEST(ChooseJobUid, Rule3NoFreeUidIsResourceExhausted) {
  const UidRange two{5000, 2};
  const absl::StatusOr<uint32_t> uid = ChooseJobUid(kJob, two, {{5000, "other"}}, {5001});
  EXPECT_EQ(uid.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(uid.status().message()), ::testing::HasSubstr("--job-uid-count"));
}

TEST(ReleasableUids, Rule4AUidGoesOnceItsJobIsUnknownAndNoProcessRunsAsIt) {
  const std::map<uint32_t, std::string> holders = {
      {5000, "running"},   // the agent still knows a rank of it
      {5001, "leftover"},  // unknown, but a process still runs as it
      {5002, "gone"},      // unknown, no process: released
  };
  EXPECT_THAT(ReleasableUids(holders, {"running"}, {5001}), ElementsAre(5002u));
  EXPECT_THAT(ReleasableUids(holders, {"running", "gone"}, {5001}), IsEmpty());
}

// A fake /proc: one status file per pid, with the Uid line the kernel writes.
class FakeProc {
 public:
  void Add(int pid, const std::string& uid_line, const std::string& cgroups = "0::/user.slice\n") {
    const std::string dir = dir_.path() + "/" + std::to_string(pid);
    std::filesystem::create_directories(dir);
    std::ofstream(dir + "/status") << "Name:\tpython3\nUmask:\t0022\n"
                                   << uid_line << "\nGid:\t0\t0\t0\t0\n";
    std::ofstream(dir + "/cgroup") << cgroups;
  }
  const std::string& path() const { return dir_.path(); }

 private:
  testing::TempDir dir_;
};

TEST(UidsInUse, ReadsEveryUidFieldOfEveryProcessInTheRange) {
  FakeProc proc;
  proc.Add(10, "Uid:\t1900000001\t1900000001\t1900000001\t1900000001");
  proc.Add(11, "Uid:\t0\t1900000002\t0\t0");           // a setuid effective uid counts too
  proc.Add(12, "Uid:\t1000\t1000\t1000\t1900000003");  // and a filesystem uid
  proc.Add(13, "Uid:\t999\t999\t999\t999");            // outside the range
  std::filesystem::create_directories(proc.path() + "/self-not-a-pid");
  EXPECT_EQ(UidsInUse(kRange, proc.path()),
            (std::set<uint32_t>{1900000001, 1900000002, 1900000003}));
  EXPECT_THAT(UidsInUse(kRange, proc.path() + "/missing"), IsEmpty());
}

// Rule 2's exception, as the scan applies it: a process in a rank cgroup of the job asking.
TEST(UidsInUse, LeavesOutTheRanksOfTheJobAskingByTheirCgroup) {
  FakeProc proc;
  proc.Add(10, "Uid:\t1900000001\t1900000001\t1900000001\t1900000001",
           std::string("5:memory:/gradhub-agent-a-0123456789ab/") + kJob + ".1.0\n");
  proc.Add(11, "Uid:\t1900000002\t1900000002\t1900000002\t1900000002",
           "5:memory:/gradhub-agent-a-0123456789ab/other-job.1.0\n");
  EXPECT_EQ(UidsInUse(kRange, proc.path(), kJob), (std::set<uint32_t>{1900000002}));
  EXPECT_EQ(UidsInUse(kRange, proc.path()), (std::set<uint32_t>{1900000001, 1900000002}));
}

TEST(InRankCgroupOfJob, OnlyARankCgroupOfThatJobUnderAnAgentsDirectory) {
  const std::string job = kJob;
  // cgroup v1 (the memory hierarchy's line among others) and v2.
  EXPECT_TRUE(
      InRankCgroupOfJob("12:pids:/docker/x\n5:memory:/docker/x/gradhub-agent-a-"
                        "0123456789ab/" +
                            job + ".3.1\n1:name=systemd:/docker/x\n",
                        job));
  EXPECT_TRUE(InRankCgroupOfJob("0::/gradhub-agent-b-0123456789ab/" + job + ".1.12\n", job));
  EXPECT_FALSE(InRankCgroupOfJob("0::/gradhub-agent-b-0123456789ab/" + job + ".1.12\n", "other"));
  // Not a rank's name: no attempt and rank, or not digits.
  EXPECT_FALSE(InRankCgroupOfJob("0::/gradhub-agent-b-x/" + job + ".1\n", job));
  EXPECT_FALSE(InRankCgroupOfJob("0::/gradhub-agent-b-x/" + job + ".1.x\n", job));
  EXPECT_FALSE(InRankCgroupOfJob("0::/gradhub-agent-b-x/" + job + "x.1.0\n", job));
  // Not directly under an agent's directory: a cgroup some job made below its own (were it
  // delegated one), or one elsewhere.
  EXPECT_FALSE(InRankCgroupOfJob("0::/gradhub-agent-b-x/other.1.0/" + job + ".1.0\n", job));
  EXPECT_FALSE(InRankCgroupOfJob("0::/user.slice/" + job + ".1.0\n", job));
  EXPECT_FALSE(InRankCgroupOfJob("0::/gradhub-agent-b-x\n", job));
  EXPECT_FALSE(InRankCgroupOfJob("", job));
  EXPECT_FALSE(InRankCgroupOfJob("0::/gradhub-agent-b-x/.1.0\n", ""));
}

TEST(UidsInUse, FindsThisProcessOnTheRealProc) {
  const UidRange mine{getuid(), 1};
  EXPECT_THAT(UidsInUse(mine), ElementsAre(getuid()));
}

TEST(JobIdentity, IsTheJobsUidWithTheRankGroupWhenTheAgentSwitchesUsersElseTheNodes) {
  RankIdentity agent;
  agent.uid = 1000;
  agent.gid = 1000;
  agent.name = "me";
  EXPECT_EQ(JobIdentity(agent, 1900000042).uid, 1000u);
  RankIdentity root = agent;
  root.switch_user = true;
  const RankIdentity job = JobIdentity(root, 1900000042);
  EXPECT_TRUE(job.switch_user);
  EXPECT_EQ(job.uid, 1900000042u);
  EXPECT_EQ(job.gid, 1900000042u);
  EXPECT_EQ(job.name, "gradhub-job-1900000042");
  EXPECT_THAT(job.supplementary_gids, ElementsAre(1000u));  // the node's rank group
}

TEST(JobUids, KeepsAJobsUidReleasesItOnlyWhenNoProcessHoldsItAndDisownsItsFiles) {
  FakeProc proc;
  const UidRange two{5000, 2};
  std::vector<std::string> disowned;
  JobUids uids(
      two,
      [&](const std::string& job, uint32_t uid) {
        disowned.push_back(job + "/" + std::to_string(uid));
      },
      proc.path());
  const uint32_t a = uids.Acquire("a", {}).value();
  EXPECT_EQ(uids.Acquire("a", {"a"}).value(), a);  // a second rank of job a
  const uint32_t b = uids.Acquire("b", {"a"}).value();
  EXPECT_NE(a, b);
  // Both held by known jobs: a third job waits.
  EXPECT_EQ(uids.Acquire("c", {"a", "b"}).status().code(), absl::StatusCode::kResourceExhausted);
  // Job a is over on this node, but a leftover process still runs as its uid.
  proc.Add(77, "Uid:\t" + std::to_string(a) + "\t" + std::to_string(a) + "\t0\t0");
  EXPECT_EQ(uids.Acquire("c", {"b"}).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(disowned, IsEmpty());
  // The leftover is gone: job a's uid is released, its files given to root, and c gets it.
  std::filesystem::remove_all(proc.path() + "/77");
  EXPECT_EQ(uids.Acquire("c", {"b"}).value(), a);
  EXPECT_THAT(disowned, ElementsAre("a/" + std::to_string(a)));
  EXPECT_EQ(uids.Holders(), (std::map<uint32_t, std::string>{{a, "c"}, {b, "b"}}));
}

// Rule 2 with two agents on one machine: the second agent's ranks of a job get the uid the
// first agent's ranks of it run as, found by their cgroup; another job's still do not.
TEST(JobUids, Rule2TheSameJobsRanksOfAnotherAgentShareItsUid) {
  FakeProc proc;
  JobUids first(kRange, nullptr, proc.path()), second(kRange, nullptr, proc.path());
  const uint32_t uid = first.Acquire(kJob, {}).value();
  const std::string as_uid = "Uid:\t" + std::to_string(uid) + "\t" + std::to_string(uid) + "\t" +
                             std::to_string(uid) + "\t" + std::to_string(uid);
  proc.Add(40, as_uid, std::string("0::/gradhub-agent-a-0123456789ab/") + kJob + ".1.0\n");
  EXPECT_EQ(second.Acquire(kJob, {}).value(), uid);
  // A job whose preferred uid that is (forced by a range of one) does not get it.
  JobUids third(UidRange{uid, 1}, nullptr, proc.path());
  EXPECT_EQ(third.Acquire("another-job", {}).status().code(), absl::StatusCode::kResourceExhausted);
  // Nor does the job when the process runs outside a rank cgroup (a leftover of unknown job).
  FakeProc plain;
  plain.Add(41, as_uid);
  JobUids fourth(kRange, nullptr, plain.path());
  EXPECT_NE(fourth.Acquire(kJob, {}).value(), uid);
}

TEST(DisownJobFiles, GivesEveryFileUnderTheDirectoriesToRoot) {
  if (geteuid() != 0) GTEST_SKIP() << "chown to root takes root";
  testing::TempDir dir;
  const std::string job = dir.path() + "/jobs/j";
  std::filesystem::create_directories(job + "/attempt-1/rank-0");
  std::ofstream(job + "/attempt-1/rank-0/spec.json") << "{}";
  for (const std::string& path :
       {job, job + "/attempt-1", job + "/attempt-1/rank-0", job + "/attempt-1/rank-0/spec.json"}) {
    ASSERT_EQ(chown(path.c_str(), 1900000005, 1900000005), 0);
  }
  chmod((job + "/attempt-1/rank-0").c_str(), 0700);
  DisownJobFiles({job, dir.path() + "/missing"});
  for (const std::string& path :
       {job, job + "/attempt-1", job + "/attempt-1/rank-0", job + "/attempt-1/rank-0/spec.json"}) {
    struct stat info {};
    ASSERT_EQ(stat(path.c_str(), &info), 0);
    EXPECT_EQ(info.st_uid, 0u) << path;
    EXPECT_EQ(info.st_gid, 0u) << path;
  }
  struct stat rank {};
  stat((job + "/attempt-1/rank-0").c_str(), &rank);
  EXPECT_EQ(rank.st_mode & 0777, 0700u);  // modes kept
}

TEST(RemoveSharedMemoryLeftovers, RemovesOnlyReleasedOwnersRegularGradhubFiles) {
  if (geteuid() != 0) GTEST_SKIP() << "files of other owners take root";
  testing::TempDir dir;
  const uint32_t released = 1900000007, running = 1900000008;
  auto make = [&](const std::string& name, uint32_t owner) {
    const std::string path = dir.path() + "/" + name;
    std::ofstream(path) << "bucket";
    ASSERT_EQ(chown(path.c_str(), owner, owner), 0);
  };
  make("gradhub-1a2b", released);  // a region its rank died before unlinking
  make("gradhub-3c4d", running);   // a live job's
  make("other-5e6f", released);    // not ours by name
  make("link-target", running);
  ASSERT_EQ(symlink((dir.path() + "/link-target").c_str(), (dir.path() + "/gradhub-link").c_str()),
            0);
  ASSERT_EQ(lchown((dir.path() + "/gradhub-link").c_str(), released, released), 0);
  std::filesystem::create_directory(dir.path() + "/gradhub-dir");
  ASSERT_EQ(chown((dir.path() + "/gradhub-dir").c_str(), released, released), 0);

  EXPECT_EQ(
      RemoveSharedMemoryLeftovers(dir.path(), [&](uint32_t owner) { return owner == released; }),
      1);
  EXPECT_FALSE(std::filesystem::exists(dir.path() + "/gradhub-1a2b"));
  for (const char* kept :
       {"gradhub-3c4d", "other-5e6f", "link-target", "gradhub-link", "gradhub-dir"}) {
    EXPECT_TRUE(std::filesystem::exists(std::filesystem::symlink_status(dir.path() + "/" + kept)))
        << kept;
  }
  EXPECT_EQ(RemoveSharedMemoryLeftovers(dir.path() + "/missing", [](uint32_t) { return true; }), 0);
}

}  // namespace
}  // namespace gradhub::agent
