// Per-tenant data roots and a rank's memory limit on the agent (issue 36): the pure decisions
// (which roots a tenant's rank sees, which gid a tenant gets, which roots may coexist, the
// limit a rank gets; flag errors naming the flag), then the real system as a root agent sets
// it up: tenant roots closed to every other tenant's ranks, a rank of tenant B that cannot
// open a file under tenant A's root (refused by the spec check, and by the kernel when its
// code opens the file as its own uid) while tenant A's rank can, and a rank's memory limit
// read back from its cgroup or rlimit. The real halves need root and skip without it.
#include <gmock/gmock.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "gpu_worker/agent/config.h"
#include "gpu_worker/agent/isolation.h"
#include "gpu_worker/agent/node_description.h"
#include "gpu_worker/agent/rank_launch.h"
#include "gpu_worker/agent/tenant_roots.h"
#include "tests/support/subprocess.h"

namespace gradhub::agent {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

constexpr int64_t kBase = 1800000000;
constexpr int64_t kCount = int64_t{1} << 24;

// ------------------------------------------------------------------------------------------
// --tenant-data-root TENANT=DIR

TEST(TenantRootFlagTest, ATenantIsItsIdOrItsResourceName) {
  auto plain = ParseTenantRootFlag("acme=/srv/acme");
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->tenant, "tenants/acme");
  EXPECT_EQ(plain->path, "/srv/acme");
  auto named = ParseTenantRootFlag("tenants/team-2=/srv/a=b");
  ASSERT_TRUE(named.ok()) << named.status();
  EXPECT_EQ(named->tenant, "tenants/team-2");
  EXPECT_EQ(named->path, "/srv/a=b");  // only the first '=' separates
}

TEST(TenantRootFlagTest, MalformedEntriesAreRefusedNamingTheFlag) {
  for (const char* bad : {"acme", "=/srv/acme", "acme=", "Acme=/x", "1acme=/x", "tenants/=/x",
                          "ac me=/x", "tenants/acme/x=/y", "tenant/acme=/x"}) {
    auto root = ParseTenantRootFlag(bad);
    EXPECT_EQ(root.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(root.status().message(), HasSubstr("--tenant-data-root")) << bad;
  }
}

// ------------------------------------------------------------------------------------------
// The tenant's gid

TEST(TenantGidTest, ATenantsGidIsFixedByItsNameAndTheRangeAlone) {
  const gid_t acme = TenantGid("tenants/acme", kBase, kCount);
  EXPECT_EQ(acme, TenantGid("tenants/acme", kBase, kCount));  // any node, any restart
  EXPECT_GE(acme, kBase);
  EXPECT_LT(acme, kBase + kCount);
  EXPECT_NE(acme, TenantGid("tenants/acmf", kBase, kCount));
  EXPECT_EQ(TenantGid("tenants/acme", kBase + 5, kCount), acme + 5);
}

TEST(TenantGidTest, TheRangeStaysClearOfJobUidsAndTheRankGroup) {
  EXPECT_TRUE(CheckTenantGidRange(kBase, kCount, 1900000000, 1 << 20, 995).ok());
  const absl::Status jobs = CheckTenantGidRange(1900000000, 10, 1900000005, 1 << 20, 995);
  EXPECT_THAT(jobs.message(), HasSubstr("--tenant-gid-base"));
  EXPECT_THAT(jobs.message(), HasSubstr("job uids"));
  EXPECT_FALSE(CheckTenantGidRange(1899999990, 11, 1900000000, 1 << 20, 995).ok());
  EXPECT_TRUE(CheckTenantGidRange(1899999990, 10, 1900000000, 1 << 20, 995).ok());
  EXPECT_THAT(CheckTenantGidRange(990, 10, 1900000000, 1, 995).message(), HasSubstr("above 999"));
  EXPECT_THAT(CheckTenantGidRange(5000, 10, 1900000000, 1, 5004).message(),
              HasSubstr("rank user's group 5004"));
  EXPECT_FALSE(CheckTenantGidRange(kBase, 0, 1900000000, 1, 995).ok());
  EXPECT_FALSE(CheckTenantGidRange(4294967000, 1000, 1900000000, 1, 995).ok());
}

TEST(TenantGidTest, TwoTenantsOnOneGidAreRefusedNamingBoth) {
  std::vector<TenantRoot> roots = {{"tenants/a", "/a", 7}, {"tenants/a", "/a2", 7}};
  EXPECT_TRUE(CheckGidsDistinct(roots).ok());  // one tenant, two roots
  roots.push_back({"tenants/b", "/b", 7});
  const absl::Status collision = CheckGidsDistinct(roots);
  EXPECT_THAT(collision.message(), HasSubstr("tenants/a and tenants/b"));
  EXPECT_THAT(collision.message(), HasSubstr("--tenant-gid-base"));
}

// ------------------------------------------------------------------------------------------
// Which roots coexist, which a rank sees

TEST(TenantRootsApartTest, RootsOfDifferentOwnersNeverOverlap) {
  const std::vector<std::string> shared = {"/data"};
  EXPECT_TRUE(CheckRootsApart(shared, {{"tenants/a", "/database", 1}}).ok());
  for (const char* path : {"/data", "/data/a", "/"}) {
    const absl::Status status = CheckRootsApart(shared, {{"tenants/a", path, 1}});
    EXPECT_THAT(status.message(), HasSubstr("overlaps --data-root /data")) << path;
    EXPECT_THAT(status.message(), HasSubstr("--tenant-data-root tenants/a=")) << path;
  }
  EXPECT_THAT(CheckRootsApart({}, {{"tenants/a", "/t/a", 1}, {"tenants/b", "/t/a/b", 2}}).message(),
              HasSubstr("another tenant"));
  EXPECT_FALSE(CheckRootsApart({}, {{"tenants/a", "/t", 1}, {"tenants/b", "/t", 2}}).ok());
  EXPECT_TRUE(CheckRootsApart({}, {{"tenants/a", "/t/a", 1}, {"tenants/a", "/t/a/x", 1}}).ok());
}

TEST(TenantRootsOfRankTest, ARankSeesTheSharedRootsAndItsTenantsOnly) {
  const std::vector<std::string> shared = {"/data", "/models"};
  const std::vector<TenantRoot> tenants = {
      {"tenants/a", "/t/a", 11}, {"tenants/b", "/t/b", 22}, {"tenants/a", "/t/a2", 11}};
  EXPECT_THAT(RootsOfTenant(shared, tenants, "tenants/a"),
              ElementsAre("/data", "/models", "/t/a", "/t/a2"));
  EXPECT_THAT(RootsOfTenant(shared, tenants, "tenants/b"), ElementsAre("/data", "/models", "/t/b"));
  EXPECT_THAT(RootsOfTenant(shared, tenants, "tenants/c"), ElementsAre("/data", "/models"));
  EXPECT_THAT(RootsOfTenant(shared, tenants, ""), ElementsAre("/data", "/models"));
  EXPECT_THAT(RootsOfTenant({}, tenants, "tenants/c"), IsEmpty());
  EXPECT_EQ(GidOfTenant(tenants, "tenants/b"), 22u);
  EXPECT_EQ(GidOfTenant(tenants, "tenants/c"), 0u);
  EXPECT_EQ(GidOfTenant(tenants, ""), 0u);
}

// ------------------------------------------------------------------------------------------
// The limit a rank gets

v1::JobSpec SpecWithMemory(int64_t mib) {
  v1::JobSpec spec;
  spec.set_memory_per_rank_mib(mib);
  return spec;
}

NodeIsolation CappedNode(int64_t cap, MemoryMechanism mechanism = MemoryMechanism::kCgroupV2) {
  NodeIsolation isolation;
  isolation.memory_limit_bytes = cap;
  isolation.memory_mechanism = mechanism;
  return isolation;
}

TEST(RankMemoryLimitTest, WithoutASpecValueARankGetsTheSlotsCap) {
  EXPECT_EQ(*RankMemoryLimit(CappedNode(int64_t{4} << 30), SpecWithMemory(0)), int64_t{4} << 30);
  EXPECT_EQ(*RankMemoryLimit(CappedNode(0), SpecWithMemory(0)), 0);  // no cap, no limit
}

TEST(RankMemoryLimitTest, TheSpecsValueWinsUpToTheCap) {
  EXPECT_EQ(*RankMemoryLimit(CappedNode(int64_t{4} << 30), SpecWithMemory(1024)), int64_t{1} << 30);
  EXPECT_EQ(*RankMemoryLimit(CappedNode(int64_t{4} << 30), SpecWithMemory(4096)), int64_t{4} << 30);
  // No cap: any value, applied by the node's mechanism (rlimit under --memory-isolation none).
  EXPECT_EQ(*RankMemoryLimit(CappedNode(0, MemoryMechanism::kRlimit), SpecWithMemory(1 << 20)),
            int64_t{1} << 40);
}

TEST(RankMemoryLimitTest, AboveTheCapIsTheSpecsFaultNamingTheField) {
  const auto over = RankMemoryLimit(CappedNode(int64_t{4} << 30), SpecWithMemory(4097));
  EXPECT_EQ(over.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(over.status().message(), HasSubstr("memoryPerRankMib: 4097 MiB"));
  EXPECT_THAT(over.status().message(), HasSubstr("4096 MiB per slot"));
}

TEST(RankMemoryLimitTest, ValuesOutOfRangeOrWithoutAMechanismAreRefused) {
  for (const int64_t mib : {int64_t{-1}, (int64_t{1} << 24) + 1}) {
    EXPECT_THAT(RankMemoryLimit(CappedNode(0), SpecWithMemory(mib)).status().message(),
                HasSubstr("memoryPerRankMib"))
        << mib;
  }
  EXPECT_THAT(
      RankMemoryLimit(CappedNode(0, MemoryMechanism::kNone), SpecWithMemory(64)).status().message(),
      HasSubstr("memoryPerRankMib"));
}

// ------------------------------------------------------------------------------------------
// The agent's set-up and its checks, on real directories

// A root agent's configuration over a temporary tree: shared/, tenant-a/ (a file), tenant-b/.
struct TenantTree {
  testing::TempDir dir;
  std::string shared = dir.path() + "/shared";
  std::string a = dir.path() + "/tenant-a";
  std::string b = dir.path() + "/tenant-b";
  std::string a_file = a + "/train.csv";

  TenantTree() {
    chmod(dir.path().c_str(), 0755);
    for (const std::string& path : {shared, a, b, dir.path() + "/work"}) {
      std::filesystem::create_directories(path);
      chmod(path.c_str(), 0755);
    }
    std::ofstream(a_file) << "1,2,3,0\n";
    chmod(a_file.c_str(), 0644);  // readable by anyone who may enter tenant-a/
  }

  AgentConfig Config(const std::string& run_as) const {
    AgentConfig config;
    config.name = "tenant-test";
    config.run_as = run_as;
    config.work_dir = dir.path() + "/work";
    config.data_roots = {shared};
    config.tenant_data_roots = {"a=" + a, "tenants/b=" + b};
    config.memory_per_slot = int64_t{256} << 20;
    config.slots = 1;
    return config;
  }
};

// The user a root agent runs ranks as here (gradhub-rank where `make setup` made it).
std::string TestRankUserName() {
  for (const char* name : {"gradhub-rank", "nobody"}) {
    if (ResolveRankIdentity(name).ok()) return name;
  }
  return "";
}

TEST(TenantSetUpTest, BadTenantRootsStopTheAgentNamingTheFlag) {
  TenantTree tree;
  AgentConfig config = tree.Config(geteuid() == 0 ? TestRankUserName() : "");
  config.master_port_base = 0;  // a non-root agent may then keep tenant roots
  const auto refused = [&](std::vector<std::string> roots) {
    AgentConfig bad = config;
    bad.tenant_data_roots = std::move(roots);
    return std::string(SetUpIsolation(bad).status().message());
  };
  EXPECT_THAT(refused({"a"}), HasSubstr("--tenant-data-root a: must be TENANT=DIR"));
  EXPECT_THAT(refused({"a=" + tree.dir.path() + "/missing"}),
              HasSubstr("--tenant-data-root " + tree.dir.path() + "/missing: not an existing"));
  EXPECT_THAT(refused({"a=" + tree.a_file}), HasSubstr("not an existing directory"));
  EXPECT_THAT(refused({"a=" + tree.shared}), HasSubstr("overlaps --data-root"));
  EXPECT_THAT(refused({"a=" + tree.a, "b=" + tree.a}), HasSubstr("of another tenant"));
  // A symlink is a root's spelling; its real path must keep apart as well.
  const std::string link = tree.dir.path() + "/link-to-shared";
  std::filesystem::create_directory_symlink(tree.shared, link);
  EXPECT_THAT(refused({"a=" + link}), HasSubstr("overlaps --data-root"));
  config.tenant_gid_base = 1900000000;  // the job uids' range
  EXPECT_THAT(SetUpIsolation(config).status().message(), HasSubstr("--tenant-gid-base"));
}

TEST(TenantSetUpTest, ARootAgentClosesEachTenantRootToOtherTenantsAndReportsThem) {
  if (geteuid() != 0 || TestRankUserName().empty()) GTEST_SKIP() << "needs root and a rank user";
  TenantTree tree;
  const AgentConfig config = tree.Config(TestRankUserName());
  auto isolation = SetUpIsolation(config);
  ASSERT_TRUE(isolation.ok()) << isolation.status();
  const gid_t a_gid = TenantGid("tenants/a", kBase, kCount);
  ASSERT_EQ(isolation->tenant_roots.size(), 2u);
  EXPECT_EQ(isolation->tenant_roots[0].gid, a_gid);
  for (const TenantRoot& root : isolation->tenant_roots) {
    struct stat info;
    ASSERT_EQ(stat(root.path.c_str(), &info), 0);
    EXPECT_EQ(info.st_gid, root.gid) << root.path;
    EXPECT_EQ(info.st_mode & 07777, 0750u) << root.path;
  }
  AgentConfig described = config;
  described.isolation = *isolation;
  auto node = DescribeNode(described);
  ASSERT_TRUE(node.ok()) << node.status();
  ASSERT_EQ(node->tenant_data_roots_size(), 2);
  EXPECT_EQ(node->tenant_data_roots(0).tenant(), "tenants/a");
  EXPECT_EQ(node->tenant_data_roots(0).path(), tree.a);
  EXPECT_EQ(node->tenant_data_roots(1).tenant(), "tenants/b");
  EXPECT_EQ(node->memory_per_slot_bytes(), int64_t{256} << 20);
  EXPECT_THAT(DescribeIsolation(*isolation), HasSubstr("tenants/a=" + tree.a));
  if (!isolation->cgroup_dir.empty()) rmdir(isolation->cgroup_dir.c_str());
}

// ------------------------------------------------------------------------------------------
// Real ranks of two tenants

v1::RankAssignment TenantAssignment(const std::string& tenant, const std::string& path,
                                    int64_t memory_mib) {
  v1::RankAssignment assignment;
  assignment.set_job("jobs/7d1c3a52-0000-4000-8000-00000000000" + tenant.substr(8, 1));
  assignment.set_attempt(1);
  assignment.set_tenant(tenant);
  assignment.mutable_spec()->mutable_dataset()->mutable_csv()->set_path(path);
  assignment.mutable_spec()->set_memory_per_rank_mib(memory_mib);
  return assignment;
}

// A script rank's identity: a uid (and group) of its job's own, no passwd entry.
RankIdentity JobIdentity(uid_t uid, gid_t rank_gid) {
  RankIdentity identity;
  identity.switch_user = true;
  identity.name = absl::StrCat("gradhub-job-", uid);
  identity.uid = identity.gid = uid;
  identity.supplementary_gids = {rank_gid};
  return identity;
}

struct RankRun {
  RankProcessStatus status;
  std::string out;
  std::string cgroup;  // the rank's cgroup directory ("" under the rlimit)
};

// The rank's process as the agent starts it (IsolateRank), running `script` in /bin/sh; its
// output read back as the agent reads a failed script rank's (the last stderr lines).
RankRun RunRank(const NodeIsolation& isolation, const v1::RankAssignment& assignment,
                const std::string& script) {
  RankLaunch launch;
  launch.job_id = assignment.job().substr(5);
  RankProcessOptions options;
  const absl::Status isolated = IsolateRank(isolation, launch, assignment, &options);
  EXPECT_TRUE(isolated.ok()) << isolated;
  RankRun run;
  if (options.memory_cgroup) run.cgroup = options.memory_cgroup->path();
  options.argv = {"/bin/sh", "-c", "exec 1>&2\n" + script};
  options.env = {{"CGROUP", run.cgroup}};
  options.message_lines = 10;
  auto process = RankProcess::Start(std::move(options));
  EXPECT_TRUE(process.ok()) << process.status();
  if (!process.ok()) return run;
  EXPECT_TRUE((*process)->Wait(absl::Seconds(60)));
  run.status = (*process)->Status();
  run.out = run.status.last_stderr_line;
  return run;
}

// What a rank's code tries: the file under tenant A's root, its groups, its memory limit as
// the kernel holds it (memory.max on cgroup v2, memory.limit_in_bytes on v1, else the rlimit).
std::string ProbeScript(const std::string& file) {
  return "cat " + file +
         " >/dev/null 2>&1 && echo OPENED || echo DENIED\n"
         "grep '^Groups:' /proc/self/status\n"
         "if [ -n \"$CGROUP\" ]; then\n"
         "  grep -q \"$(basename \"$CGROUP\")\" /proc/self/cgroup && echo IN-CGROUP\n"
         "  echo limit=$(cat \"$CGROUP/memory.max\" 2>/dev/null ||"
         " cat \"$CGROUP/memory.limit_in_bytes\")\n"
         "else\n"
         "  echo limit=$(awk '/^Max data size/ {print $4}' /proc/self/limits)\n"
         "fi\n";
}

TEST(TenantRanksTest, OnlyTheTenantsOwnRanksReadItsRootAndEachGetsItsMemoryLimit) {
  if (geteuid() != 0 || TestRankUserName().empty()) GTEST_SKIP() << "needs root and a rank user";
  TenantTree tree;
  auto isolation = SetUpIsolation(tree.Config(TestRankUserName()));
  ASSERT_TRUE(isolation.ok()) << isolation.status();
  const gid_t a_gid = TenantGid("tenants/a", kBase, kCount);
  constexpr int64_t kMib = 96;
  std::map<std::string, RankRun> runs;
  for (const std::string tenant : {"tenants/a", "tenants/b"}) {
    const v1::RankAssignment assignment = TenantAssignment(tenant, tree.a_file, kMib);
    // The spec check before the start: B naming A's file is its spec's fault.
    const std::string problem = CheckRankSpec(*isolation, assignment);
    if (tenant == "tenants/a") {
      EXPECT_EQ(problem, "");
    } else {
      EXPECT_THAT(problem, HasSubstr("dataset.csv.path"));
      EXPECT_THAT(problem, HasSubstr("allowed: " + tree.shared + ", " + tree.b + ")"));
    }
    // A script rank's code opens the file anyway, as its job's uid.
    NodeIsolation rank = *isolation;
    rank.identity =
        JobIdentity(tenant == "tenants/a" ? 1900000101 : 1900000102, isolation->identity.gid);
    runs[tenant] = RunRank(rank, assignment, ProbeScript(tree.a_file));
  }
  const RankRun& a = runs["tenants/a"];
  const RankRun& b = runs["tenants/b"];
  EXPECT_THAT(a.out, HasSubstr("OPENED"));
  EXPECT_THAT(a.out, HasSubstr(std::to_string(a_gid)));
  EXPECT_THAT(b.out, HasSubstr("DENIED"));
  EXPECT_THAT(b.out, Not(HasSubstr(std::to_string(a_gid))));
  for (const RankRun* run : {&a, &b}) {
    EXPECT_EQ(run->status.exit_code, 0) << run->out;
    EXPECT_EQ(run->status.memory_limit_bytes, kMib << 20);
    EXPECT_THAT(run->out, HasSubstr("limit=" + std::to_string(kMib << 20))) << run->out;
    if (!run->cgroup.empty()) {
      EXPECT_THAT(run->out, HasSubstr("IN-CGROUP"));
    }
  }
  std::cerr << "memory limit enforced by " << MemoryMechanismName(isolation->memory_mechanism)
            << "\n";
  if (!isolation->cgroup_dir.empty()) rmdir(isolation->cgroup_dir.c_str());
}

// A rank asking more than a slot is refused before it starts, as the spec's fault; one asking
// nothing gets the slot's cap.
TEST(TenantRanksTest, ARankAskingMoreThanASlotIsRefusedAndOneAskingNothingGetsTheCap) {
  if (geteuid() != 0 || TestRankUserName().empty()) GTEST_SKIP() << "needs root and a rank user";
  TenantTree tree;
  auto isolation = SetUpIsolation(tree.Config(TestRankUserName()));
  ASSERT_TRUE(isolation.ok()) << isolation.status();
  const v1::RankAssignment greedy = TenantAssignment("tenants/b", tree.b, 257);
  EXPECT_THAT(CheckRankSpec(*isolation, greedy), HasSubstr("memoryPerRankMib: 257 MiB"));
  RankLaunch launch;
  launch.job_id = "greedy";
  RankProcessOptions options;
  EXPECT_EQ(IsolateRank(*isolation, launch, greedy, &options).code(),
            absl::StatusCode::kInvalidArgument);
  v1::RankAssignment plain = TenantAssignment("tenants/b", tree.b, 0);
  plain.mutable_spec()->clear_dataset();
  const RankRun run = RunRank(*isolation, plain, ProbeScript(tree.a_file));
  EXPECT_EQ(run.status.memory_limit_bytes, int64_t{256} << 20);
  EXPECT_THAT(run.out, HasSubstr("limit=" + std::to_string(int64_t{256} << 20)));
  EXPECT_THAT(run.out, HasSubstr("DENIED"));  // the rank user without a tenant's group too
  if (!isolation->cgroup_dir.empty()) rmdir(isolation->cgroup_dir.c_str());
}

}  // namespace
}  // namespace gradhub::agent
