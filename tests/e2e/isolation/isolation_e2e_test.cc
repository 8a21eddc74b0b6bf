// Tenants against the node and each other, through the real stack:
//   - spec paths that point out of the data roots (/etc/shadow, a symlink out, "../"), at
//     devices and kernel files (/dev/zero, /proc/self/environ) or at a directory are refused,
//     through gRPC and REST, naming the field; a marker planted in a file outside the roots
//     (readable by the ranks' user, so only the roots protect it) appears in nothing a tenant
//     can read;
//   - no rank runs as root;
//   - a rank that needs more memory than its slot is stopped at its limit and its job FAILS
//     saying so, while another job on the same node succeeds;
//   - a tenant's data root (--tenant-data-root) serves that tenant's ranks only, by the
//     agent's check and by the kernel, and a rank's memory limit is its spec's
//     memoryPerRankMib;
//   - deploy/local/cluster.sh (make demo) leaves no process behind.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <google/protobuf/util/json_util.h>
#include <google/protobuf/util/time_util.h>

#include <dirent.h>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "tests/support/local_cluster.h"

namespace gradhub {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kMarker[] = "GRADHUB-ISOLATION-MARKER-51c9e";

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// A small classification CSV: 4 features, 2 classes.
void WriteCsv(const std::string& path) {
  std::ofstream out(path);
  for (int i = 0; i < 200; ++i) {
    const int label = i % 2;
    out << (label + 0.1 * (i % 7)) << "," << (1 - label) << "," << (i % 5) * 0.2 << ","
        << label * 0.5 << "," << label << "\n";
  }
}

v1::JobSpec CsvJob(const std::string& path, int64_t max_steps = 20) {
  v1::JobSpec spec;
  spec.set_display_name("isolation");
  for (int width : {4, 16, 2}) spec.mutable_model()->mutable_mlp()->add_layers(width);
  spec.mutable_dataset()->mutable_csv()->set_path(path);
  spec.mutable_optimizer()->mutable_sgd()->set_lr(0.05);
  spec.set_batch_size_per_rank(8);
  spec.set_max_steps(max_steps);
  spec.set_log_every_steps(1);
  return spec;
}

std::string ToJson(const google::protobuf::Message& message) {
  std::string json;
  (void)google::protobuf::util::MessageToJsonString(message, &json);
  return json;
}

class IsolationE2eTest : public ::testing::Test {
 protected:
  // The files live in the test's own directory, readable by the ranks' user; `data_` is
  // every agent's first data root.
  void StartCluster(testing::LocalClusterOptions options) {
    chmod(files_.path().c_str(), 0755);
    data_ = files_.path() + "/data";
    outside_ = files_.path() + "/outside";
    PlantFiles();
    options.data_roots.insert(options.data_roots.begin(), data_);
    cluster_ = std::make_unique<testing::LocalCluster>(options);
    ASSERT_TRUE(cluster_->Start());
  }

  void PlantFiles() {
    for (const std::string& dir : {data_, outside_, data_ + "/adir"}) {
      std::filesystem::create_directories(dir);
      chmod(dir.c_str(), 0755);
    }
    // Readable by everyone: only the data roots keep a rank from it.
    std::ofstream(outside_ + "/secret.csv") << kMarker << "," << kMarker << "\n1,2\n";
    chmod((outside_ + "/secret.csv").c_str(), 0644);
    WriteCsv(data_ + "/good.csv");
    chmod((data_ + "/good.csv").c_str(), 0644);
    std::filesystem::create_symlink(outside_ + "/secret.csv", data_ + "/link.csv");
  }

  // CreateJob through gRPC: the status.
  grpc::Status SubmitGrpc(const v1::JobSpec& spec, v1::Job* job) {
    v1::CreateJobRequest request;
    *request.mutable_spec() = spec;
    return cluster_->jobs().CreateJob(cluster_->TenantContext().get(), request, job);
  }

  // POST /v1/jobs: the HTTP status and body.
  std::pair<int, std::string> SubmitRest(const v1::JobSpec& spec) {
    httplib::Client client("127.0.0.1", cluster_->api_http_port());
    client.set_read_timeout(10, 0);
    const httplib::Headers headers = {{"Authorization", "Bearer " + cluster_->tenant_token()}};
    auto response = client.Post("/v1/jobs", headers, ToJson(spec), "application/json");
    if (!response) return {0, "no answer"};
    return {response->status, response->body};
  }

  // Everything a tenant can read about a job: itself, its events, every log line.
  std::string TenantView(const std::string& name) {
    std::string text = cluster_->Get(name).DebugString() + cluster_->Describe(name);
    for (const std::string& line : cluster_->Logs(name, 0, 0)) text += line + "\n";
    return text;
  }

  // Memory of each slot in the memory tests.
  static constexpr int64_t kLimit = int64_t{512} << 20;
  // The body of both memory tests (see there).
  void OverLimitStoppedNeighbourFinishes();

  testing::TempDir files_;
  std::unique_ptr<testing::LocalCluster> cluster_;
  std::string data_, outside_;
};

// Refused at CreateJob: no registered node's roots hold the path (or it is not clean).
TEST_F(IsolationE2eTest, PathsNoNodeServesAreRefusedAtSubmitNamingTheField) {
  testing::LocalClusterOptions options;
  options.agents = {"a"};
  StartCluster(options);
  std::string tenant_view;
  for (const std::string& path :
       {std::string("/etc/shadow"), data_ + "/../outside/secret.csv", outside_ + "/secret.csv",
        std::string("/dev/zero"), std::string("/proc/self/environ")}) {
    v1::Job job;
    const grpc::Status status = SubmitGrpc(CsvJob(path), &job);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << path;
    EXPECT_THAT(status.error_message(), HasSubstr("dataset.csv.path")) << path;
    const auto [http, body] = SubmitRest(CsvJob(path));
    EXPECT_EQ(http, 400) << path << ": " << body;
    EXPECT_THAT(body, HasSubstr("dataset.csv.path")) << path;
    tenant_view += status.error_message() + body;
  }
  // The other path fields are checked the same way.
  v1::JobSpec text = CsvJob("");
  text.mutable_dataset()->mutable_text()->set_path("/etc/ssh/ssh_host_ed25519_key");
  text.mutable_model()->mutable_transformer()->set_context_length(8);
  v1::Job job;
  EXPECT_THAT(SubmitGrpc(text, &job).error_message(), HasSubstr("dataset.text.path"));
  v1::JobSpec script = CsvJob(data_ + "/good.csv");
  script.mutable_model()->mutable_torchscript()->set_path("/root/model.pt");
  EXPECT_THAT(SubmitGrpc(script, &job).error_message(), HasSubstr("model.torchscript.path"));
  EXPECT_THAT(tenant_view, Not(HasSubstr(kMarker)));
}

// Under a root by its spelling, refused by the agent on the node: a symlink out, a directory,
// a device, a kernel file. The job FAILS at once (a USER failure, never retried), its reason
// naming the field; nothing of the files reaches the tenant.
TEST_F(IsolationE2eTest, PathsTheNodeWillNotReadFailTheJobNamingTheField) {
  testing::LocalClusterOptions options;
  options.agents = {"a"};
  options.data_roots = {"/dev", "/proc"};  // so that these reach the node
  StartCluster(options);
  const std::vector<std::pair<std::string, std::string>> cases = {
      {data_ + "/link.csv", "symbolic link"},
      {data_ + "/adir", "a directory"},
      {"/dev/zero", "a device"},
      {"/proc/self/environ", "pseudo filesystem"},
  };
  std::vector<std::pair<std::string, std::string>> jobs;  // name, expected reason
  for (const auto& [path, why] : cases) {
    v1::Job job;
    ASSERT_TRUE(SubmitGrpc(CsvJob(path), &job).ok()) << path;
    jobs.push_back({job.name(), why});
    const auto [http, body] = SubmitRest(CsvJob(path));
    ASSERT_EQ(http, 200) << body;
    const std::smatch name = [&] {
      std::smatch match;
      static const std::regex kName("\"name\":\"(jobs/[^\"]+)\"");
      std::regex_search(body, match, kName);
      return match;
    }();
    ASSERT_FALSE(name.empty()) << body;
    jobs.push_back({name[1].str(), why});
  }
  // A text dataset trains on the file's bytes: the symlink must not get that far either.
  v1::JobSpec text = CsvJob("");
  text.mutable_dataset()->mutable_text()->set_path(data_ + "/link.csv");
  text.mutable_model()->mutable_transformer()->set_context_length(8);
  text.mutable_model()->mutable_transformer()->set_d_model(16);
  text.mutable_model()->mutable_transformer()->set_layers(1);
  text.mutable_model()->mutable_transformer()->set_heads(2);
  jobs.push_back({cluster_->Submit(text).name(), "symbolic link"});

  for (const auto& [name, why] : jobs) {
    const v1::Job job = cluster_->AwaitJob(name, testing::Ended, std::chrono::seconds(60));
    EXPECT_EQ(job.state(), v1::Job::FAILED) << cluster_->Describe(name);
    EXPECT_THAT(job.state_reason(), HasSubstr("dataset.")) << job.state_reason();
    EXPECT_THAT(job.state_reason(), HasSubstr(why)) << job.state_reason();
    EXPECT_EQ(job.attempt(), 1) << "a USER failure is not retried";
    EXPECT_THAT(TenantView(name), Not(HasSubstr(kMarker)));
  }
}

// A job reading a file under a root trains; its ranks never run as root. With a root agent they
// run as their job's uid (job_uids.h: one of --job-uid-base's range, the same for both ranks,
// its own number as group), with the node rank user's group as their only other group.
TEST_F(IsolationE2eTest, RanksReadTheirDataAndNeverRunAsRoot) {
  testing::LocalClusterOptions options;
  options.agents = {"a"};
  StartCluster(options);
  v1::JobSpec spec = CsvJob(data_ + "/good.csv", 1000000);
  spec.mutable_distributed()->set_world_size(2);
  const std::string name = cluster_->Submit(spec).name();
  const v1::Job running = cluster_->AwaitJob(name, [](const v1::Job& job) {
    return job.state() == v1::Job::RUNNING || testing::Ended(job);
  });
  ASSERT_EQ(running.state(), v1::Job::RUNNING) << cluster_->Describe(name);
  const std::vector<pid_t> ranks = cluster_->TrainersOf("a");
  ASSERT_EQ(ranks.size(), 2u);
  std::set<std::string> job_uids;
  for (pid_t pid : ranks) {
    const std::string status = ReadFile("/proc/" + std::to_string(pid) + "/status");
    std::smatch uid;
    ASSERT_TRUE(std::regex_search(status, uid, std::regex("Uid:\\s+(\\d+)\\s+(\\d+)\\s+(\\d+)")));
    for (int i = 1; i <= 3; ++i) EXPECT_NE(uid[i].str(), "0") << "rank pid " << pid;
    if (geteuid() == 0) {
      const int64_t job_uid = std::stoll(uid[1].str());
      EXPECT_GE(job_uid, 1900000000) << "rank pid " << pid;  // the agent's default range
      EXPECT_LT(job_uid, 1900000000 + (int64_t{1} << 20)) << "rank pid " << pid;
      EXPECT_THAT(status, ::testing::ContainsRegex("Gid:\t" + uid[1].str() + "\t"));
      const passwd* rank_user = getpwnam("gradhub-rank");
      if (rank_user == nullptr) rank_user = getpwnam("nobody");  // as LocalCluster runs agents
      ASSERT_NE(rank_user, nullptr);
      EXPECT_THAT(status, ::testing::ContainsRegex("Groups:\t" + std::to_string(rank_user->pw_gid) +
                                                   " *\n"));
      job_uids.insert(uid[1].str());
    }
  }
  if (geteuid() == 0) EXPECT_EQ(job_uids.size(), 1u) << "both ranks of the job, one uid";
  cluster_->Cancel(name);
  EXPECT_EQ(cluster_->AwaitJob(name, testing::Ended).state(), v1::Job::CANCELLED);
}

// A model far larger than a slot's memory: stopped at the limit within seconds, the job FAILS
// with the reason, and a job beside it on the same node finishes.
TEST_F(IsolationE2eTest, ARankOverItsMemoryLimitIsStoppedAndItsNeighbourFinishes) {
  testing::LocalClusterOptions options;
  options.agents = {"a"};
  options.slots = 2;
  options.memory_per_slot = std::to_string(kLimit);
  StartCluster(options);  // auto: a memory cgroup where the agent can make one
  OverLimitStoppedNeighbourFinishes();
}

// Where no cgroup can be made: RLIMIT_DATA, and the trainer reports the failed allocation.
TEST_F(IsolationE2eTest, UnderTheRlimitFallbackTheRankFailsWithTheSameReason) {
  testing::LocalClusterOptions options;
  options.agents = {"a"};
  options.slots = 2;
  options.memory_per_slot = std::to_string(kLimit);
  options.memory_isolation = "rlimit";
  StartCluster(options);
  OverLimitStoppedNeighbourFinishes();
}

void IsolationE2eTest::OverLimitStoppedNeighbourFinishes() {
  v1::JobSpec small;
  small.set_display_name("neighbour");
  for (int width : {8, 16, 2}) small.mutable_model()->mutable_mlp()->add_layers(width);
  auto* synthetic = small.mutable_dataset()->mutable_synthetic();
  synthetic->set_num_samples(256);
  synthetic->set_num_features(8);
  synthetic->set_num_classes(2);
  small.mutable_optimizer()->mutable_sgd()->set_lr(0.05);
  small.set_batch_size_per_rank(16);
  small.set_max_steps(300);
  const std::string neighbour = cluster_->Submit(small).name();
  ASSERT_EQ(cluster_
                ->AwaitJob(neighbour,
                           [](const v1::Job& job) {
                             return job.state() == v1::Job::RUNNING || testing::Ended(job);
                           })
                .state(),
            v1::Job::RUNNING);

  // Two 16384 x 16384 layers: 1 GiB of float32 weights each, before gradients.
  v1::JobSpec huge = small;
  huge.set_display_name("too-big");
  huge.mutable_model()->mutable_mlp()->clear_layers();
  for (int width : {8, 16384, 16384, 2}) huge.mutable_model()->mutable_mlp()->add_layers(width);
  const auto submitted = std::chrono::steady_clock::now();
  const std::string name = cluster_->Submit(huge).name();
  const v1::Job failed = cluster_->AwaitJob(name, testing::Ended, std::chrono::seconds(60));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - submitted).count();
  EXPECT_EQ(failed.state(), v1::Job::FAILED) << cluster_->Describe(name);
  EXPECT_THAT(failed.state_reason(),
              HasSubstr("out of memory: limit " + std::to_string(kLimit) + " bytes"));
  EXPECT_LT(seconds, 30) << "from submission to FAILED";
  std::cerr << "over-limit job: FAILED " << seconds
            << " s after submission: " << failed.state_reason() << "\n";

  const v1::Job finished = cluster_->AwaitJob(neighbour, testing::Ended);
  EXPECT_EQ(finished.state(), v1::Job::SUCCEEDED) << cluster_->Describe(neighbour);
  EXPECT_EQ(finished.attempt(), 1) << "the neighbour was never disturbed";
}

// ------------------------------------------------------------------------------------------
// Per-tenant data roots and a rank's memory (issue 36)

// A script rank's code: tries to read each file named in argv, then prints its memory limit as
// the kernel holds it (RLIMIT_DATA when set, else its memory cgroup's).
constexpr char kProbeScript[] = R"(import sys
for path in sys.argv[1:]:
    try:
        open(path).read()
        print("OPEN", path, "OPENED")
    except OSError as error:
        print("OPEN", path, "DENIED", error.errno)
def limit():
    for line in open("/proc/self/limits"):
        if line.startswith("Max data size") and line.split()[3] != "unlimited":
            return line.split()[3]
    for line in open("/proc/self/cgroup"):
        number, controllers, path = line.rstrip("\n").split(":", 2)
        if "memory" in controllers.split(","):
            return open("/sys/fs/cgroup/memory" + path + "/memory.limit_in_bytes").read().strip()
    for line in open("/proc/self/cgroup"):
        if line.startswith("0::"):
            return open("/sys/fs/cgroup" + line[3:].strip() + "/memory.max").read().strip()
print("LIMIT", limit())
)";

// The memory limit of process `pid` as the kernel holds it, read as kProbeScript reads it.
std::string KernelMemoryLimit(pid_t pid) {
  const std::string proc = "/proc/" + std::to_string(pid);
  std::smatch match;
  const std::string limits = ReadFile(proc + "/limits");
  if (std::regex_search(limits, match, std::regex("Max data size +([0-9]+)"))) return match[1];
  const std::string cgroups = ReadFile(proc + "/cgroup");
  if (std::regex_search(cgroups, match, std::regex("\\d+:[^:\\n]*memory[^:\\n]*:([^\\n]*)"))) {
    return ReadFile("/sys/fs/cgroup/memory" + match[1].str() + "/memory.limit_in_bytes");
  }
  if (std::regex_search(cgroups, match, std::regex("0::([^\\n]*)"))) {
    return ReadFile("/sys/fs/cgroup" + match[1].str() + "/memory.max");
  }
  return "";
}

// A spec naming a file of another tenant's root: refused at CreateJob (the api knows the
// node's tenant roots), or by the agent's check before the start; either way naming the field,
// and nothing trains.
void ExpectRefusedNamingThePath(testing::LocalCluster& cluster, const v1::JobSpec& spec) {
  v1::CreateJobRequest request;
  *request.mutable_spec() = spec;
  v1::Job job;
  const grpc::Status status =
      cluster.jobs().CreateJob(cluster.TenantContext().get(), request, &job);
  if (status.ok()) {
    const v1::Job failed = cluster.AwaitJob(job.name(), testing::Ended);
    EXPECT_EQ(failed.state(), v1::Job::FAILED) << cluster.Describe(job.name());
    EXPECT_THAT(failed.state_reason(), HasSubstr("dataset.csv.path"));
    EXPECT_EQ(failed.progress().step(), 0);
  } else {
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(status.error_message(), HasSubstr("dataset.csv.path"));
  }
}

// kProbeScript as a script job of the cluster's tenant over `paths`, with memoryPerRankMib
// `mib`: its output once it SUCCEEDED and its last line arrived.
std::string RunProbeScript(testing::LocalCluster& cluster, const std::vector<std::string>& paths,
                           int64_t mib) {
  v1::JobSpec script;
  script.set_display_name("probe");
  script.mutable_script()->set_code(cluster.UploadCode({{"probe.py", kProbeScript}}));
  script.mutable_script()->set_entrypoint("probe.py");
  for (const std::string& path : paths) script.mutable_script()->add_args(path);
  script.set_memory_per_rank_mib(mib);
  const std::string name = cluster.Submit(script).name();
  EXPECT_EQ(cluster.AwaitJob(name, testing::Ended).state(), v1::Job::SUCCEEDED)
      << cluster.Describe(name);
  std::string out;  // the output is shipped apart from the exit: wait for its last line
  for (int i = 0; i < 100 && out.find("LIMIT") == std::string::npos; ++i) {
    if (i > 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    out.clear();
    for (const std::string& line : cluster.Logs(name, 0, 0)) out += line + "\n";
  }
  return out;
}

// The cluster's tenant ("team") has a root of its own; another tenant ("rival") has one too,
// with a file readable by anyone who may enter it. Through the real api and a root agent:
//   - team's trainer job reads its root and runs with its spec's memoryPerRankMib as the limit;
//   - team's trainer job naming rival's file is refused (at CreateJob, or by the agent's check
//     before the start), naming the field, and never trains;
//   - team's script rank, whose code opens rival's file directly as its job's uid, is refused
//     by the kernel, while it opens its own tenant's file; its limit is its spec's too.
TEST_F(IsolationE2eTest, ATenantsRootServesOnlyItsOwnRanksAndARankGetsItsSpecsMemory) {
  if (geteuid() != 0) GTEST_SKIP() << "tenant roots are closed to other tenants by a root agent";
  const std::string own = files_.path() + "/team-data", rival = files_.path() + "/rival-data";
  for (const std::string& dir : {own, rival}) std::filesystem::create_directories(dir);
  WriteCsv(own + "/train.csv");
  WriteCsv(rival + "/train.csv");
  for (const std::string& file : {own + "/train.csv", rival + "/train.csv"}) {
    chmod(file.c_str(), 0644);
  }
  testing::LocalClusterOptions options;
  options.agents = {"a"};
  options.checkpoint_service = true;  // the script's code
  options.memory_per_slot = std::to_string(kLimit);
  options.tenant_data_roots = {"team=" + own, "tenants/rival=" + rival};
  StartCluster(options);

  v1::JobSpec mine = CsvJob(own + "/train.csv", 1000000);
  mine.set_memory_per_rank_mib(448);
  const std::string name = cluster_->Submit(mine).name();
  ASSERT_EQ(cluster_
                ->AwaitJob(name,
                           [](const v1::Job& job) {
                             return job.state() == v1::Job::RUNNING || testing::Ended(job);
                           })
                .state(),
            v1::Job::RUNNING)
      << cluster_->Describe(name);
  const std::vector<pid_t> ranks = cluster_->TrainersOf("a");
  ASSERT_EQ(ranks.size(), 1u);
  EXPECT_EQ(KernelMemoryLimit(ranks[0]), std::to_string(448 << 20) + "\n");
  cluster_->Cancel(name);

  ExpectRefusedNamingThePath(*cluster_, CsvJob(rival + "/train.csv"));
  const std::string out =
      RunProbeScript(*cluster_, {rival + "/train.csv", own + "/train.csv"}, 300);
  EXPECT_THAT(out, HasSubstr("OPEN " + rival + "/train.csv DENIED 13")) << out;  // EACCES
  EXPECT_THAT(out, HasSubstr("OPEN " + own + "/train.csv OPENED")) << out;
  EXPECT_THAT(out, HasSubstr("LIMIT " + std::to_string(300 << 20))) << out;
}

// The trainer checks again on what it opens, whatever the agent checked: its roots come from
// GRADHUB_DATA_ROOTS (":" = none), and a refusal is a user error (exit 10) naming the field.
TEST(TrainerInputPolicyTest, TheTrainerRefusesWhatItsRootsDoNotHold) {
  testing::TempDir dir;
  const std::string data = dir.path() + "/data", outside = dir.path() + "/outside";
  std::filesystem::create_directories(data);
  std::filesystem::create_directories(outside);
  std::ofstream(outside + "/secret.csv") << kMarker << "\n";
  WriteCsv(data + "/good.csv");
  std::filesystem::create_symlink(outside + "/secret.csv", data + "/link.csv");
  const auto run = [&](const std::string& path, const std::string& roots) {
    const std::string spec = dir.path() + "/spec.json";
    std::ofstream(spec, std::ios::trunc) << ToJson(CsvJob(path, 2));
    return testing::Run({testing::BinaryPath("gradhub-trainer"), "--spec", spec},
                        {{"GRADHUB_DATA_ROOTS", roots}, {"GRADHUB_MAX_INPUT_BYTES", "100000"}},
                        std::chrono::seconds(120));
  };
  const auto link = run(data + "/link.csv", data);
  EXPECT_EQ(link.exit_code, 10) << link.err;
  EXPECT_THAT(link.err, HasSubstr("dataset.csv.path"));
  EXPECT_THAT(link.err, HasSubstr("symbolic link"));
  const auto none = run(data + "/good.csv", ":");
  EXPECT_EQ(none.exit_code, 10) << none.err;
  EXPECT_THAT(none.err, HasSubstr("allowed: none"));
  const auto good = run(data + "/good.csv", data);
  EXPECT_EQ(good.exit_code, 0) << good.err;
  for (const auto& result : {link, none, good}) {
    EXPECT_THAT(result.out + result.err, Not(HasSubstr(kMarker)));
  }
}

// ------------------------------------------------------------------------------------------
// make demo's script

// Pids of the processes whose environment holds `marker` (every process the script starts
// inherits it: PostgreSQL through runuser and pg_ctl, the services, agents and their ranks).
std::vector<pid_t> ProcessesMarked(const std::string& marker) {
  std::vector<pid_t> pids;
  DIR* proc = opendir("/proc");
  while (dirent* entry = readdir(proc)) {
    const pid_t pid = atoi(entry->d_name);
    if (pid <= 0 || pid == getpid()) continue;
    const std::string environ = ReadFile("/proc/" + std::string(entry->d_name) + "/environ");
    if (environ.find(marker) != std::string::npos) pids.push_back(pid);
  }
  closedir(proc);
  return pids;
}

TEST(DemoScriptTest, LeavesNoProcessBehind) {
  if (geteuid() != 0) GTEST_SKIP() << "the defect was root's: PostgreSQL stopped as root";
  testing::TempDir dir;
  const std::string marker = "GRADHUB_DEMO_TEST=" + std::to_string(getpid());
  const std::string count = dir.path() + "/during";  // the script's processes, mid-run
  // Instead of the digits job: a short world-size-4 job through the CLI, then a count of the
  // script's processes while everything still runs.
  const std::string spec = dir.path() + "/job.yaml";
  std::ofstream(spec) << "model: {mlp: {layers: [8, 16, 2]}}\n"
                         "dataset: {synthetic: {numSamples: 256, numFeatures: 8, numClasses: 2}}\n"
                         "optimizer: {sgd: {lr: 0.05}}\nbatchSizePerRank: 16\nmaxSteps: 30\n"
                         "distributed: {worldSize: 4, ranksPerNode: 2}\n";
  chmod(dir.path().c_str(), 0755);
  chmod(spec.c_str(), 0644);
  const std::string script = "job=$(\"$GRADHUB_BIN/gradhub\" submit -f " + spec +
                             ") || exit 1\n"
                             "\"$GRADHUB_BIN/gradhub\" watch \"$job\" >/dev/null; status=$?\n"
                             "for f in $(grep -ls '" +
                             marker +
                             "' /proc/[0-9]*/environ 2>/dev/null); do\n"
                             "  tr '\\0' ' ' < \"${f%/environ}/cmdline\"; echo; done > " +
                             count +
                             "\n"
                             "exit $status\n";
  const std::string source = std::getenv("GRADHUB_SOURCE_DIR");
  const auto run = testing::Run({"/usr/bin/env", marker, source + "/deploy/local/cluster.sh",
                                 std::getenv("GRADHUB_BUILD_DIR"), "--", "/bin/sh", "-c", script},
                                {}, std::chrono::seconds(240));
  EXPECT_EQ(run.exit_code, 0) << run.out << run.err;
  // What ran while the cluster did (the marker reaches every kind of process).
  const std::string during = ReadFile(count);
  for (const char* kind :
       {"postgres", "gradhub-api", "gradhub-checkpoint", "gradhub-metrics", "gradhub-agent"}) {
    EXPECT_THAT(during, HasSubstr(kind)) << during;
  }
  std::vector<pid_t> left;
  for (int i = 0; i < 50; ++i) {  // a SIGKILLed process takes a moment to be reaped
    left = ProcessesMarked(marker);
    if (left.empty()) break;
    usleep(100000);
  }
  std::string names;
  for (pid_t pid : left) names += ReadFile("/proc/" + std::to_string(pid) + "/cmdline") + "\n";
  EXPECT_TRUE(left.empty()) << "left behind:\n" << names;
}

}  // namespace
}  // namespace gradhub
