#include "gpu_worker/agent/rank_launch.h"

#include <google/protobuf/util/json_util.h>
#include <google/protobuf/util/message_differencer.h>
#include <google/protobuf/util/time_util.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <set>

#include "gpu_worker/agent/agent.h"
#include "gpu_worker/agent/node_description.h"
#include "gpu_worker/agent/node_devices.h"
#include "gpu_worker/agent/rank_process.h"
#include "gpu_worker/agent/script_launch.h"
#include "gpu_worker/devices/devices.h"
#include "tests/support/subprocess.h"

namespace gradhub::agent {
namespace {

AgentConfig Config(const std::string& work_dir) {
  AgentConfig config;
  config.work_dir = work_dir;
  config.trainer = "/opt/gradhub/bin/gradhub-trainer";
  config.token = "node-secret";
  config.tls_ca_file = "/etc/gradhub/ca.pem";
  config.name = "node-a";
  config.checkpoint_server = "10.0.0.2:7071";
  config.metrics_server = "10.0.0.3:7072";
  config.isolation.data_roots = {"/data", "/srv/models"};
  config.isolation.max_input_bytes = 1 << 30;
  config.isolation.memory_limit_bytes = int64_t{6} << 30;
  return config;
}

v1::RankAssignment Assignment() {
  v1::RankAssignment assignment;
  assignment.set_job("jobs/0b7c7a4e-1f4e-4d1c-9a57-2f0c1b1d3e55");
  assignment.set_attempt(3);
  assignment.set_rank(1);
  assignment.set_world_size(4);
  assignment.set_local_rank(0);
  assignment.set_local_world_size(2);
  assignment.set_store_address("10.0.0.1:7070");
  assignment.set_rendezvous_prefix("jobs/0b7c7a4e-1f4e-4d1c-9a57-2f0c1b1d3e55/attempts/3/");
  (*assignment.mutable_env())["NCCL_DEBUG"] = "INFO";
  (*assignment.mutable_env())["GRADHUB_RANK"] = "7";  // the agent's value wins
  v1::JobSpec& spec = *assignment.mutable_spec();
  spec.set_display_name("digits-mlp");
  spec.set_max_steps(1000);
  spec.set_batch_size_per_rank(64);
  spec.set_seed(42);
  return assignment;
}

// What the preparation gives a rank (rank_preparer.h): its job token.
PreparedRank Prepared() {
  PreparedRank prepared;
  prepared.token = "ghj_job-secret";
  return prepared;
}

TEST(RankLaunchTest, DirectoriesAndEnvironmentFollowTheTrainerContract) {
  const auto launch = PlanRankLaunch(Config("/w"), Assignment(), Prepared());
  ASSERT_TRUE(launch.ok()) << launch.status();
  const std::string id = "0b7c7a4e-1f4e-4d1c-9a57-2f0c1b1d3e55";
  EXPECT_EQ(launch->job_id, id);
  EXPECT_EQ(launch->dir, "/w/jobs/" + id + "/attempt-3/rank-1");
  EXPECT_EQ(launch->spec_path, "/w/jobs/" + id + "/attempt-3/rank-1/spec.json");
  EXPECT_EQ(launch->checkpoint_dir, "/w/checkpoints/" + id);
  EXPECT_EQ(launch->pid_file, "/w/pids/" + id + ".3.1.pid");
  EXPECT_EQ(launch->argv, std::vector<std::string>{"/opt/gradhub/bin/gradhub-trainer"});
  const std::map<std::string, std::string> want = {
      {"GRADHUB_SPEC", launch->spec_path},
      {"GRADHUB_RANK", "1"},
      {"GRADHUB_WORLD_SIZE", "4"},
      {"GRADHUB_LOCAL_RANK", "0"},
      {"GRADHUB_LOCAL_WORLD_SIZE", "2"},
      {"GRADHUB_JOB_ID", id},
      {"GRADHUB_ATTEMPT", "3"},
      {"GRADHUB_STORE", "grpc://10.0.0.1:7070"},
      {"GRADHUB_TOKEN", "ghj_job-secret"},  // the rank's job token, never the node's
      {"GRADHUB_TLS_CA", "/etc/gradhub/ca.pem"},
      {"GRADHUB_CHECKPOINT_DIR", "/w/checkpoints/" + id},
      {"GRADHUB_CHECKPOINT_SERVER", "10.0.0.2:7071"},
      {"GRADHUB_METRICS_SERVER", "10.0.0.3:7072"},
      {"GRADHUB_NODE_NAME", "node-a"},
      {"GRADHUB_DATA_ROOTS", "/data:/srv/models"},
      {"GRADHUB_MAX_INPUT_BYTES", "1073741824"},
      {"GRADHUB_MEMORY_LIMIT_BYTES", "6442450944"},
      // A CPU node: no GPU visible, whatever the agent sees, and AUTO is Gloo.
      {"CUDA_VISIBLE_DEVICES", ""},
      {"GRADHUB_DEVICE", "cpu"},
      {"GRADHUB_BACKEND", "GLOO"},
      {"NCCL_DEBUG", "INFO"},
  };
  EXPECT_EQ(launch->env, want);
}

TEST(RankLaunchTest, DevicesAndCheckpointRoot) {
  AgentConfig config = Config("/w");
  config.checkpoint_root = "/shared/ckpt";
  v1::RankAssignment assignment = Assignment();
  assignment.add_device_indices(0);
  assignment.add_device_indices(2);
  assignment.clear_store_address();
  const auto launch = PlanRankLaunch(config, assignment, Prepared());
  ASSERT_TRUE(launch.ok());
  EXPECT_EQ(launch->env.at("CUDA_VISIBLE_DEVICES"), "0,2");
  EXPECT_EQ(launch->env.at("GRADHUB_CHECKPOINT_DIR"),
            "/shared/ckpt/0b7c7a4e-1f4e-4d1c-9a57-2f0c1b1d3e55");
  EXPECT_EQ(launch->env.at("GRADHUB_STORE"), "");
}

// Two ranks of one AUTO job on a node with two GPUs: each sees only its own, as cuda:0, and
// both are told the node is a GPU node and to use NCCL.
TEST(RankLaunchTest, RanksOnAGpuNodeGetTheirOwnGpuAndNcclForAuto) {
  AgentConfig config = Config("/w");
  config.devices = FakeGpus(2);
  std::set<std::string> visible;
  for (int local_rank : {0, 1}) {
    v1::RankAssignment assignment = Assignment();
    assignment.set_rank(local_rank);
    assignment.set_local_rank(local_rank);
    assignment.add_device_indices(local_rank);  // the server's: the rank's slot
    const auto launch = PlanRankLaunch(config, assignment, Prepared());
    ASSERT_TRUE(launch.ok()) << launch.status();
    EXPECT_EQ(launch->env.at("GRADHUB_DEVICE"), "cuda");
    EXPECT_EQ(launch->env.at("GRADHUB_BACKEND"), "NCCL");
    visible.insert(launch->env.at("CUDA_VISIBLE_DEVICES"));
  }
  EXPECT_EQ(visible, (std::set<std::string>{"0", "1"}));
}

TEST(RankLaunchTest, AnExplicitBackendPassesThroughAndAutoIsGlooOnACpuNode) {
  AgentConfig gpu = Config("/w");
  gpu.devices = FakeGpus(1);
  v1::RankAssignment assignment = Assignment();
  assignment.add_device_indices(0);
  assignment.mutable_spec()->mutable_distributed()->set_backend(v1::DistributedSpec::GLOO);
  EXPECT_EQ(PlanRankLaunch(gpu, assignment, Prepared())->env.at("GRADHUB_BACKEND"), "GLOO");

  v1::RankAssignment on_cpu = Assignment();
  on_cpu.mutable_spec()->mutable_distributed()->set_backend(v1::DistributedSpec::NCCL);
  const auto launch = PlanRankLaunch(Config("/w"), on_cpu, Prepared());
  EXPECT_EQ(launch->env.at("GRADHUB_BACKEND"), "NCCL");  // the trainer refuses it, naming why
  EXPECT_EQ(launch->env.at("GRADHUB_DEVICE"), "cpu");
  EXPECT_EQ(launch->env.at("CUDA_VISIBLE_DEVICES"), "");
}

// An agent started with CUDA_VISIBLE_DEVICES=2,3 numbers those GPUs 0 and 1; its ranks must
// be given the GPUs it was given, not the machine's first two.
TEST(RankLaunchTest, DeviceIndicesAreNamedAsTheAgentSeesThem) {
  devices::DeviceInventory inventory;
  inventory.driver_version = "550.54.15";
  inventory.cuda_driver_version = "12.4";
  for (int i = 0; i < 2; ++i) {
    devices::GpuInfo gpu;
    gpu.index = i;
    gpu.name = "NVIDIA H200";
    gpu.total_memory_bytes = int64_t{141} << 30;
    gpu.compute_capability = "9.0";
    gpu.uuid = "GPU-" + std::to_string(i);
    inventory.gpus.push_back(gpu);
  }
  AgentConfig config = Config("/w");
  config.devices = FromInventory(inventory, "2,3");
  ASSERT_TRUE(config.devices.cuda);
  EXPECT_EQ(config.devices.gpus[1].driver_version(), "550.54.15");
  EXPECT_EQ(config.devices.gpus[1].cuda_version(), "12.4");
  v1::RankAssignment assignment = Assignment();
  assignment.add_device_indices(1);
  EXPECT_EQ(PlanRankLaunch(config, assignment, Prepared())->env.at("CUDA_VISIBLE_DEVICES"), "3");
  config.devices = FromInventory(inventory, nullptr);
  EXPECT_EQ(PlanRankLaunch(config, assignment, Prepared())->env.at("CUDA_VISIBLE_DEVICES"), "1");
  EXPECT_FALSE(FromInventory(devices::DeviceInventory{}, nullptr).cuda);
}

// The environment `env` gives a rank started on top of this (the agent's) environment: what
// `name` holds there, read back from the process.
std::string SeenByTheRank(const std::map<std::string, std::string>& env, const std::string& name) {
  RankProcessOptions options;
  options.argv = {"/bin/sh", "-c", "echo \"$" + name + "\""};
  options.env = env;
  std::mutex mu;
  std::string seen;
  options.on_line = [&](const OutputLine& line) {
    std::lock_guard<std::mutex> lock(mu);
    seen = line.text;
  };
  absl::StatusOr<std::unique_ptr<RankProcess>> process = RankProcess::Start(std::move(options));
  EXPECT_TRUE(process.ok()) << process.status();
  if (!process.ok()) return "";
  EXPECT_TRUE((*process)->Wait(absl::Seconds(10)));  // exited: every line delivered
  std::lock_guard<std::mutex> lock(mu);
  return seen;
}

// distributed.collectiveTimeoutSeconds reaches trainer and script ranks alike and overrides
// the node's default, which a rank inherits from the agent's environment; unset (0), the agent
// adds nothing, so the node's default (or the trainer's 60 s) stands.
TEST(RankLaunchTest, TheJobsCollectiveTimeoutOverridesTheNodesForEveryKindOfRank) {
  ASSERT_EQ(setenv("GRADHUB_COLLECTIVE_TIMEOUT", "45s", 1), 0);  // the node's default
  v1::RankAssignment trainer = Assignment();
  v1::RankAssignment script = Assignment();
  script.mutable_spec()->mutable_script()->set_code("sha256:" + std::string(64, 'a'));
  script.mutable_spec()->mutable_script()->set_entrypoint("train.py");
  for (v1::RankAssignment* assignment : {&trainer, &script}) {
    const bool is_script = assignment == &script;
    const auto plan = [&] {
      return is_script ? PlanScriptLaunch(Config("/w"), *assignment, Prepared())
                       : PlanRankLaunch(Config("/w"), *assignment, Prepared());
    };
    absl::StatusOr<RankLaunch> launch = plan();
    ASSERT_TRUE(launch.ok()) << launch.status();
    EXPECT_EQ(launch->env.count("GRADHUB_COLLECTIVE_TIMEOUT"), 0u) << is_script;
    EXPECT_EQ(SeenByTheRank(launch->env, "GRADHUB_COLLECTIVE_TIMEOUT"), "45s") << is_script;
    assignment->mutable_spec()->mutable_distributed()->set_collective_timeout_seconds(5);
    (*assignment->mutable_env())["GRADHUB_COLLECTIVE_TIMEOUT"] = "90s";  // the spec's wins
    launch = plan();
    ASSERT_TRUE(launch.ok()) << launch.status();
    EXPECT_EQ(launch->env.at("GRADHUB_COLLECTIVE_TIMEOUT"), "5s") << is_script;
    EXPECT_EQ(SeenByTheRank(launch->env, "GRADHUB_COLLECTIVE_TIMEOUT"), "5s") << is_script;
  }
  unsetenv("GRADHUB_COLLECTIVE_TIMEOUT");
}

TEST(RankLaunchTest, RefusesJobNamesThatAreNotPathSafe) {
  for (const char* job :
       {"0b7c7a4e", "jobs/", "jobs/..", "jobs/a/../../etc", "jobs/a b", "tenants/x/jobs/y"}) {
    v1::RankAssignment assignment = Assignment();
    assignment.set_job(job);
    const auto launch = PlanRankLaunch(Config("/w"), assignment, Prepared());
    EXPECT_EQ(launch.status().code(), absl::StatusCode::kInvalidArgument) << job;
  }
  v1::RankAssignment negative = Assignment();
  negative.set_rank(-1);
  EXPECT_FALSE(PlanRankLaunch(Config("/w"), negative, Prepared()).ok());
}

TEST(RankLaunchTest, WritesTheSpecAsProto3Json) {
  testing::TempDir dir;
  const v1::RankAssignment assignment = Assignment();
  const auto launch = PlanRankLaunch(Config(dir.path()), assignment, Prepared());
  ASSERT_TRUE(launch.ok());
  ASSERT_TRUE(PrepareRankFiles(*launch, assignment).ok());
  EXPECT_TRUE(std::filesystem::is_directory(launch->dir));
  EXPECT_TRUE(std::filesystem::is_directory(launch->checkpoint_dir));
  EXPECT_TRUE(std::filesystem::is_directory(dir.path() + "/pids"));
  std::ifstream in(launch->spec_path);
  const std::string json((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(json.find("\"displayName\": \"digits-mlp\""), std::string::npos) << json;
  v1::JobSpec parsed;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(json, &parsed).ok()) << json;
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(parsed, assignment.spec()));
  // Preparing again (same key after an agent restart) overwrites.
  EXPECT_TRUE(PrepareRankFiles(*launch, assignment).ok());
}

// With a job's uid (a root agent), the rank's directory, its spec and its job's checkpoint
// directory are that uid's, 0700, and so is what an earlier attempt of the job left in the
// checkpoint directory as another uid (it could not read its checkpoints otherwise).
TEST(RankLaunchTest, AJobsUidOwnsItsDirectoriesAndTheCheckpointsOfEarlierAttempts) {
  if (geteuid() != 0) GTEST_SKIP() << "chown to another uid takes root";
  testing::TempDir dir;
  const v1::RankAssignment assignment = Assignment();
  const auto launch = PlanRankLaunch(Config(dir.path()), assignment, Prepared());
  ASSERT_TRUE(launch.ok());
  std::filesystem::create_directories(launch->checkpoint_dir + "/cache");
  const std::string earlier = launch->checkpoint_dir + "/cache/step-10.ckpt";
  std::ofstream(earlier) << "bytes";
  ASSERT_EQ(chown(earlier.c_str(), 1900000001, 1900000001), 0);
  RankIdentity job;
  job.switch_user = true;
  job.uid = job.gid = 1900000002;
  ASSERT_TRUE(PrepareRankFiles(*launch, assignment, job).ok());
  for (const std::string& path : {launch->dir, launch->spec_path, launch->checkpoint_dir,
                                  launch->checkpoint_dir + "/cache", earlier}) {
    struct stat info {};
    ASSERT_EQ(stat(path.c_str(), &info), 0) << path;
    EXPECT_EQ(info.st_uid, 1900000002u) << path;
    EXPECT_EQ(info.st_gid, 1900000002u) << path;
  }
  struct stat rank_dir {};
  stat(launch->dir.c_str(), &rank_dir);
  EXPECT_EQ(rank_dir.st_mode & 0777, 0700u);
}

TEST(RankStatusTest, FromAProcessStatus) {
  RankProcessStatus process;
  process.pid = 4242;
  process.state = RankState::kRunning;
  process.last_step = 40;
  process.last_step_time = absl::FromUnixMillis(1700000000123);
  v1::RankStatus status = ToRankStatus({"jobs/j", 2, 1}, process);
  EXPECT_EQ(status.job(), "jobs/j");
  EXPECT_EQ(status.attempt(), 2);
  EXPECT_EQ(status.rank(), 1);
  EXPECT_EQ(status.pid(), 4242);
  EXPECT_EQ(status.state(), v1::RankStatus::RUNNING);
  EXPECT_EQ(status.last_step(), 40);
  EXPECT_EQ(google::protobuf::util::TimeUtil::TimestampToMilliseconds(status.last_step_time()),
            1700000000123);
  EXPECT_TRUE(status.message().empty());

  process = {};
  EXPECT_FALSE(ToRankStatus({"jobs/j", 2, 1}, process).has_last_step_time());
  EXPECT_EQ(ToRankStatus({"jobs/j", 2, 1}, process).state(), v1::RankStatus::STARTING);

  process.exited = true;
  process.state = RankState::kFailed;
  process.exit_code = 12;
  process.last_stderr_line = "gradhub-trainer (rank 1): lost its peers: timeout";
  status = ToRankStatus({"jobs/j", 2, 1}, process);
  EXPECT_EQ(status.state(), v1::RankStatus::FAILED);
  EXPECT_EQ(status.exit_code(), 12);
  EXPECT_EQ(status.message(), process.last_stderr_line);

  process.last_stderr_line.clear();
  process.exit_code = 0;
  process.signal = SIGSEGV;
  status = ToRankStatus({"jobs/j", 2, 1}, process);
  EXPECT_EQ(status.signal(), SIGSEGV);
  EXPECT_EQ(status.message(), "killed by signal 11");
}

TEST(NodeDescriptionTest, LabelsNameAndSlots) {
  auto labels = ParseLabels("team=vision, zone = a ,empty=");
  ASSERT_TRUE(labels.ok());
  EXPECT_EQ(*labels,
            (std::map<std::string, std::string>{{"team", "vision"}, {"zone", "a"}, {"empty", ""}}));
  EXPECT_TRUE(ParseLabels("")->empty());
  EXPECT_EQ(ParseLabels("novalue").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseLabels("=x").status().code(), absl::StatusCode::kInvalidArgument);

  EXPECT_EQ(NodeResourceName("cpu-1"), "nodes/cpu-1");
  EXPECT_EQ(NodeResourceName("nodes/cpu-1"), "nodes/cpu-1");

  AgentConfig config = Config("/w");
  config.name = "cpu-1";
  config.slots = 4;
  config.labels = "team=vision";
  config.address = "10.0.0.7";
  auto node = DescribeNode(config);
  ASSERT_TRUE(node.ok());
  EXPECT_EQ(node->name(), "nodes/cpu-1");
  EXPECT_EQ(node->kind(), v1::Node::CPU);
  EXPECT_EQ(node->slots(), 4);
  EXPECT_EQ(node->address(), "10.0.0.7");
  EXPECT_EQ(node->labels().at("team"), "vision");
  EXPECT_EQ(node->devices_size(), 0);
  EXPECT_FALSE(node->agent_version().empty());
  config.slots = 0;
  EXPECT_EQ(DescribeNode(config).status().code(), absl::StatusCode::kInvalidArgument);
  config.slots = -1;  // the default: one slot on a CPU node
  EXPECT_EQ(DescribeNode(config)->slots(), 1);
}

TEST(NodeDescriptionTest, AgentWithTwoFakeGpusRegistersACudaNodeWithTwoSlotsAndItsDevices) {
  AgentConfig config = Config("/w");
  config.devices = FakeGpus(2);
  auto node = DescribeNode(config);
  ASSERT_TRUE(node.ok()) << node.status();
  EXPECT_EQ(node->kind(), v1::Node::CUDA);
  EXPECT_EQ(node->slots(), 2);
  ASSERT_EQ(node->devices_size(), 2);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(node->devices(i).index(), i);
    EXPECT_NE(node->devices(i).name().find("Fake GPU"), std::string::npos);
    EXPECT_GT(node->devices(i).total_memory_bytes(), 0);
    EXPECT_FALSE(node->devices(i).driver_version().empty());
    EXPECT_FALSE(node->devices(i).cuda_version().empty());
  }
  config.slots = 1;  // fewer slots than GPUs: allowed, the second GPU idles
  EXPECT_EQ(DescribeNode(config)->slots(), 1);
}

TEST(NodeDescriptionTest, SlotsAboveTheGpuCountAreRefusedNamingSlots) {
  AgentConfig config = Config("/w");
  config.devices = FakeGpus(2);
  config.slots = 3;
  const auto node = DescribeNode(config);
  EXPECT_EQ(node.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(node.status().message().find("--slots: 3 is more than this node's 2 GPU(s)"),
            std::string::npos)
      << node.status();
}

}  // namespace
}  // namespace gradhub::agent
