// script_launch.h: how a script rank is launched, one test per rule.
#include "gpu_worker/agent/script_launch.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "services/common/code_archive/code_archive.h"

namespace gradhub::agent {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr char kJob[] = "0b7c7a4e-1f4e-4d1c-9a57-2f0c1b1d3e55";

AgentConfig Config(const std::string& work_dir) {
  AgentConfig config;
  config.work_dir = work_dir;
  config.token = "node-secret";
  config.tls_ca_file = "/etc/gradhub/ca.pem";
  config.name = "node-a";
  config.checkpoint_server = "10.0.0.2:7071";
  config.checkpoint_url = "http://10.0.0.2:8081";
  config.metrics_url = "http://10.0.0.3:9464";
  config.python_dir = "/opt/gradhub/python";
  return config;
}

v1::RankAssignment Assignment() {
  v1::RankAssignment assignment;
  assignment.set_job(std::string("jobs/") + kJob);
  assignment.set_attempt(3);
  assignment.set_rank(3);
  assignment.set_world_size(4);
  assignment.set_local_rank(1);
  assignment.set_local_world_size(2);
  assignment.set_group_rank(1);
  assignment.set_master_addr("10.0.0.7");
  assignment.set_master_port(29501);
  assignment.set_store_address("10.0.0.1:7070");
  v1::ScriptSpec& script = *assignment.mutable_spec()->mutable_script();
  script.set_code("sha256:" + std::string(64, 'a'));
  script.set_entrypoint("src/train.py");
  script.add_args("--epochs");
  script.add_args("3");
  (*script.mutable_env())["LR"] = "0.1";
  assignment.mutable_spec()->set_seed(7);
  return assignment;
}

PreparedRank Prepared() {
  PreparedRank prepared;
  prepared.code_dir = "/work/jobs/x/attempt-3/code";
  prepared.token = "ghj_job-secret";
  prepared.identity.name = "gradhub-job-1900000042";
  return prepared;
}

TEST(PlanScriptLaunch, RunsTheInterpreterOnTheEntrypointWithTheArgs) {
  const absl::StatusOr<RankLaunch> launch =
      PlanScriptLaunch(Config("/work"), Assignment(), Prepared());
  ASSERT_TRUE(launch.ok()) << launch.status();
  EXPECT_THAT(
      launch->argv,
      ElementsAre("/usr/bin/python3", "/work/jobs/x/attempt-3/code/src/train.py", "--epochs", "3"));
  EXPECT_EQ(launch->dir, std::string("/work/jobs/") + kJob + "/attempt-3/rank-3");
}

TEST(PlanScriptLaunch, GivesTorchrunsEnvironment) {
  const RankLaunch launch = *PlanScriptLaunch(Config("/work"), Assignment(), Prepared());
  const std::map<std::string, std::string> expected = {{"RANK", "3"},
                                                       {"WORLD_SIZE", "4"},
                                                       {"LOCAL_RANK", "1"},
                                                       {"LOCAL_WORLD_SIZE", "2"},
                                                       {"GROUP_RANK", "1"},
                                                       {"ROLE_RANK", "3"},
                                                       {"MASTER_ADDR", "10.0.0.7"},
                                                       {"MASTER_PORT", "29501"},
                                                       {"TORCHELASTIC_RESTART_COUNT", "2"},
                                                       {"TORCHELASTIC_RUN_ID", kJob}};
  for (const auto& [name, value] : expected) {
    ASSERT_TRUE(launch.env.count(name)) << name;
    EXPECT_EQ(launch.env.at(name), value) << name;
  }
}

TEST(PlanScriptLaunch, GivesGradhubsEnvironmentWithTheJobsTokenNeverTheNodes) {
  const RankLaunch launch = *PlanScriptLaunch(Config("/work"), Assignment(), Prepared());
  EXPECT_EQ(launch.env.at("GRADHUB_JOB_TOKEN"), "ghj_job-secret");
  EXPECT_EQ(launch.env.at("GRADHUB_STORE"), "grpc://10.0.0.1:7070");
  EXPECT_EQ(launch.env.at("GRADHUB_CHECKPOINT_URL"), "http://10.0.0.2:8081");
  EXPECT_EQ(launch.env.at("GRADHUB_METRICS_URL"), "http://10.0.0.3:9464");
  EXPECT_EQ(launch.env.at("GRADHUB_CODE_DIR"), "/work/jobs/x/attempt-3/code");
  EXPECT_EQ(launch.env.at("GRADHUB_SEED"), "7");
  EXPECT_EQ(launch.env.at("PYTHONPATH"), "/opt/gradhub/python");
  EXPECT_EQ(launch.env.at("HOME"), launch.dir);
  EXPECT_EQ(launch.env.at("LR"), "0.1");  // the spec's own
  for (const char* secret :
       {"GRADHUB_TOKEN", "GRADHUB_NODE_SESSION", "GRADHUB_NODE_NAME", "GRADHUB_SPEC"}) {
    EXPECT_EQ(launch.env.count(secret), 0u) << secret;
  }
  for (const auto& [name, value] : launch.env) {
    EXPECT_THAT(value, ::testing::Not(HasSubstr("node-secret"))) << name;
  }
}

TEST(PlanScriptLaunch, GivesTheStoreOfItsAssignmentWhichTheSpecCannotRedirect) {
  v1::RankAssignment assignment = Assignment();
  // ValidateScriptSpec refuses it; the plan drops it anyway, so a spec that slipped past
  // cannot point the rank's job token at a store of its own choosing.
  (*assignment.mutable_spec()->mutable_script()->mutable_env())["GRADHUB_STORE"] = "grpc://evil:1";
  EXPECT_EQ(PlanScriptLaunch(Config("/work"), assignment, Prepared())->env.at("GRADHUB_STORE"),
            "grpc://10.0.0.1:7070");
  assignment.clear_store_address();  // none configured: empty, as for a trainer rank
  EXPECT_EQ(PlanScriptLaunch(Config("/work"), assignment, Prepared())->env.at("GRADHUB_STORE"), "");
}

TEST(PlanScriptLaunch, RefusesAnAssignmentThatIsNotAScripts) {
  v1::RankAssignment trainer = Assignment();
  trainer.mutable_spec()->clear_script();
  EXPECT_EQ(PlanScriptLaunch(Config("/work"), trainer, Prepared()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(WithLocalRanksDevices, AScriptRankSeesItsAttemptsLocalGpusInLocalRankOrder) {
  google::protobuf::RepeatedPtrField<v1::RankAssignment> desired;
  for (const auto& [local_rank, gpu] : std::vector<std::pair<int, int>>{{1, 5}, {0, 2}}) {
    v1::RankAssignment& rank = *desired.Add() = Assignment();
    rank.set_local_rank(local_rank);
    rank.clear_device_indices();
    rank.add_device_indices(gpu);
  }
  v1::RankAssignment other_job = Assignment();
  other_job.set_job("jobs/other");
  other_job.add_device_indices(7);
  *desired.Add() = other_job;
  const v1::RankAssignment widened = WithLocalRanksDevices(desired[0], desired);
  EXPECT_THAT(widened.device_indices(), ElementsAre(2, 5));  // cuda:1 is its own GPU, 5
  const v1::RankAssignment cpu = WithLocalRanksDevices(Assignment(), desired);
  EXPECT_TRUE(cpu.device_indices().empty());  // a CPU rank stays without GPUs
}

TEST(UnpackAttemptCode, UnpacksOnceIntoTheAttemptsCodeDirectoryReadOnly) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("script_launch_test." + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir / "src" / "pkg");
  std::ofstream(dir / "src" / "train.py") << "print('hi')\n";
  std::ofstream(dir / "src" / "pkg" / "m.py") << "X = 1\n";
  const std::string archive = (dir / "code.tar").string();
  ASSERT_TRUE(code::PackDirectory((dir / "src").string(), archive).ok());
  RankIdentity self;  // no switch: the test may not be root
  const absl::StatusOr<std::string> code =
      UnpackAttemptCode(archive, (dir / "attempt-1").string(), self);
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, (dir / "attempt-1" / "code").string());
  EXPECT_TRUE(std::filesystem::exists(*code + "/pkg/m.py"));
  struct stat info {};
  ASSERT_EQ(stat((*code + "/train.py").c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 0777, 0644u);
  // A second rank of the attempt finds it and unpacks nothing.
  std::filesystem::remove(archive);
  EXPECT_EQ(UnpackAttemptCode(archive, (dir / "attempt-1").string(), self).value_or(""), *code);
  std::filesystem::remove_all(dir);
}

TEST(CheckMasterPortFree, RefusesAPortSomethingListensOn) {
  const int fd = socket(AF_INET6, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in6 address{};
  address.sin6_family = AF_INET6;
  address.sin6_addr = in6addr_any;
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  ASSERT_EQ(listen(fd, 1), 0);
  socklen_t length = sizeof(address);
  getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  const int port = ntohs(address.sin6_port);
  const absl::Status taken = CheckMasterPortFree(port);
  EXPECT_EQ(taken.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(taken.message(), HasSubstr("MASTER_PORT " + std::to_string(port)));
  close(fd);
  EXPECT_TRUE(CheckMasterPortFree(port).ok());
}

}  // namespace
}  // namespace gradhub::agent
