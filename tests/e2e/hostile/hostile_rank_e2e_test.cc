// The hostile-rank suite (issue 36): tenant B's script job runs a program that attacks, from a
// rank on the node, tenant A's jobs running beside it (a trainer job and a script job), the
// node, the services and the database. Every attack must be refused:
//   - no node token (or any secret but its own job token) in anything it can read;
//   - its job token against A's checkpoints (read, list, upload, delete), telemetry and store
//     keys;
//   - signals, ptrace, /proc/PID/environ and /proc/PID/mem of A's ranks; A's rank directories;
//   - a file of A's data root (--tenant-data-root);
//   - PostgreSQL (it asks for a password the rank cannot know);
//   - its own token once its attempt has ended.
// A positive control shows the same token worked for its own job while the attempt ran.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <openssl/sha.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "absl/strings/str_format.h"
#include "tests/e2e/hostile/hostile_rank.h"
#include "tests/e2e/script/scripts.h"
#include "tests/support/local_cluster.h"

namespace gradhub {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr auto kJobLimit = std::chrono::seconds(240);
constexpr char kVictimTenant[] = "victims";
constexpr char kVictimMarker[] = "VICTIM-ENV-MARKER-9d41c";

bool Alive(pid_t pid) { return kill(pid, 0) == 0; }

std::string Sha256Hex(const std::string& text) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(text.data()), text.size(), digest);
  std::string hex;
  for (unsigned char byte : digest) absl::StrAppendFormat(&hex, "%02x", byte);
  return hex;
}

// The port of a libpq URL: postgresql://user:password@host:PORT/db.
int PortOfUrl(const std::string& url) {
  std::smatch match;
  const std::regex port("@[^:/]+:([0-9]+)/");
  return std::regex_search(url, match, port) ? std::stoi(match[1].str()) : 0;
}

class HostileRankE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "uids per job need a root agent";
    testing::LocalClusterOptions options;
    options.agents = {"a"};
    options.slots = 4;
    options.checkpoint_service = true;
    options.metrics_service = true;
    victim_root_ = files_.path() + "/victims-data";
    std::filesystem::create_directories(victim_root_);
    std::ofstream(victim_root_ + "/secret.csv") << "1,2,3\n";
    chmod(files_.path().c_str(), 0755);
    options.tenant_data_roots = {std::string(kVictimTenant) + "=" + victim_root_};
    cluster_ = std::make_unique<testing::LocalCluster>(options);
    ASSERT_TRUE(cluster_->Start());
    victim_token_ = cluster_->CreateTenant(kVictimTenant);
  }

  // Tenant A's trainer job: long enough to outlive the attack, a checkpoint every 5 steps.
  v1::JobSpec VictimTrainerJob() {
    v1::JobSpec spec;
    spec.set_display_name("victim trainer");
    for (int width : {8, 16, 4}) spec.mutable_model()->mutable_mlp()->add_layers(width);
    auto* data = spec.mutable_dataset()->mutable_synthetic();
    data->set_num_samples(256);
    data->set_num_features(8);
    data->set_num_classes(4);
    spec.mutable_optimizer()->mutable_sgd()->set_lr(0.01);
    spec.set_batch_size_per_rank(8);
    spec.set_max_steps(100000000);
    spec.set_log_every_steps(50);
    spec.mutable_checkpoint()->set_every_steps(500);
    return spec;
  }

  v1::JobSpec ScriptJob(const std::string& digest, const std::string& entrypoint,
                        std::vector<std::string> args) {
    v1::JobSpec spec;
    spec.set_display_name(entrypoint);
    spec.mutable_script()->set_code(digest);
    spec.mutable_script()->set_entrypoint(entrypoint);
    for (std::string& arg : args) spec.mutable_script()->add_args(std::move(arg));
    spec.set_hang_timeout_seconds(120);
    return spec;
  }

  // GetJob as the admin (the victims' jobs are not the cluster tenant's).
  v1::Job AdminGet(const std::string& name) {
    v1::GetJobRequest request;
    request.set_name(name);
    v1::Job job;
    EXPECT_TRUE(cluster_->jobs().GetJob(cluster_->AdminContext().get(), request, &job).ok());
    return job;
  }

  // Polls (as the admin) until `done`, up to kJobLimit.
  v1::Job AwaitAsAdmin(const std::string& name, const std::function<bool(const v1::Job&)>& done) {
    const auto deadline = std::chrono::steady_clock::now() + kJobLimit;
    v1::Job job = AdminGet(name);
    while (!done(job) && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      job = AdminGet(name);
    }
    return job;
  }

  // The victims running, the trainer past its first checkpoint: their names.
  std::pair<std::string, std::string> StartVictims() {
    const std::string trainer = cluster_->SubmitAs(victim_token_, VictimTrainerJob()).name();
    v1::JobSpec script =
        ScriptJob(cluster_->UploadCode({{"victim.py", testing::kVictimScript}}, victim_token_),
                  "victim.py", {});
    (*script.mutable_script()->mutable_env())["VICTIM_SECRET"] = kVictimMarker;
    const std::string victim_script = cluster_->SubmitAs(victim_token_, script).name();
    const auto running_past = [](int64_t step) {
      return [step](const v1::Job& job) {
        return job.progress().step() >= step || testing::Ended(job);
      };
    };
    EXPECT_EQ(AwaitAsAdmin(trainer, running_past(600)).state(), v1::Job::RUNNING);
    EXPECT_EQ(AwaitAsAdmin(victim_script, running_past(1)).state(), v1::Job::RUNNING);
    return {trainer, victim_script};
  }

  std::string RankDir(const std::string& job) {
    return cluster_->dir() + "/agent-a/jobs/" + job.substr(std::strlen("jobs/")) +
           "/attempt-1/rank-0";
  }

  // Every "ATTACK name: verdict (detail)" line of the attacker: name -> line.
  std::map<std::string, std::string> Attacks(const std::string& job) {
    std::map<std::string, std::string> attacks;
    const std::regex attack("^ATTACK ([^:]+): (.*)$");
    for (const std::string& line : cluster_->Logs(job, 1, 0)) {
      std::smatch match;
      if (std::regex_search(line, match, attack)) attacks[match[1].str()] = match[2].str();
    }
    return attacks;
  }

  // The rank's job token, from its "TOKEN ..." line.
  std::string TokenOf(const std::string& job) {
    for (const std::string& line : cluster_->Logs(job, 1, 0)) {
      if (line.rfind("TOKEN ", 0) == 0) return line.substr(6);
    }
    return "";
  }

  testing::TempDir files_;
  std::string victim_root_, victim_token_;
  std::unique_ptr<testing::LocalCluster> cluster_;
};

TEST_F(HostileRankE2eTest, EveryAttackOfATenantsRankIsRefused) {
  const auto [trainer, victim_script] = StartVictims();
  ASSERT_FALSE(HasFailure()) << cluster_->Describe(trainer) << cluster_->Describe(victim_script);
  const std::vector<pid_t> victim_pids = cluster_->RanksOf("a");
  ASSERT_EQ(victim_pids.size(), 2u);
  const nlohmann::json args = {
      {"victim_job", trainer},
      {"victim_attempt", 1},
      {"victim_pids", victim_pids},
      {"victim_dirs", {RankDir(trainer), RankDir(victim_script)}},
      {"agent_pid", cluster_->AgentPid("a")},
      {"agent_dir", cluster_->dir() + "/agent-a"},
      {"other_tenant_file", victim_root_ + "/secret.csv"},
      {"postgres_port", PortOfUrl(cluster_->database_url())},
      {"secret_sha256s",
       {Sha256Hex(cluster_->node_token()), Sha256Hex(cluster_->tenant_token()),
        Sha256Hex(victim_token_), Sha256Hex(testing::LocalCluster::kAdminToken)}}};
  const std::string attacker =
      cluster_
          ->Submit(ScriptJob(cluster_->UploadCode({{"hostile.py", testing::kHostileRankScript}}),
                             "hostile.py", {args.dump()}))
          .name();
  const v1::Job ended = cluster_->AwaitJob(attacker, testing::Ended, kJobLimit);
  ASSERT_EQ(ended.state(), v1::Job::SUCCEEDED) << cluster_->Describe(attacker);

  const std::map<std::string, std::string> attacks = Attacks(attacker);
  std::set<std::string> expected = {"node-token",        "checkpoint-latest", "checkpoint-list",
                                    "checkpoint-upload", "checkpoint-delete", "telemetry",
                                    "store-keys",        "rank-dir-0",        "rank-dir-1",
                                    "other-tenant-data", "postgres-postgres", "postgres-gradhub"};
  for (pid_t pid : victim_pids) {
    for (const char* kind : {"signal-", "ptrace-", "environ-", "mem-"}) {
      expected.insert(kind + std::to_string(pid));
    }
  }
  for (const auto& [name, verdict] : attacks)
    std::cout << "ATTACK " << name << ": " << verdict << "\n";
  for (const std::string& name : expected) {
    ASSERT_TRUE(attacks.count(name)) << "no attempt " << name << "\n"
                                     << cluster_->Describe(attacker);
    EXPECT_THAT(attacks.at(name), ::testing::StartsWith("refused")) << name;
  }
  std::string output;
  for (const std::string& line : cluster_->Logs(attacker, 1, 0)) output += line + "\n";
  EXPECT_THAT(output, Not(HasSubstr(cluster_->node_token())));
  EXPECT_THAT(output, Not(HasSubstr(testing::LocalCluster::kAdminToken)));
  EXPECT_THAT(output, Not(HasSubstr(kVictimMarker)));
  EXPECT_THAT(output, HasSubstr("CONTROL own-checkpoint: ok"));

  // The victims never noticed.
  for (pid_t pid : victim_pids) EXPECT_TRUE(Alive(pid)) << pid;
  EXPECT_EQ(AdminGet(trainer).state(), v1::Job::RUNNING);
  EXPECT_EQ(AdminGet(victim_script).state(), v1::Job::RUNNING);

  // Its token after its attempt ended: what worked during the attempt is refused now.
  const std::string token = TokenOf(attacker);
  ASSERT_THAT(token, ::testing::StartsWith("ghj_"));
  httplib::Client checkpoints("127.0.0.1", cluster_->checkpoint_http_port());
  const std::string id = attacker.substr(std::strlen("jobs/"));
  // A well-formed upload (its sha256 is that of "late"), so that only the token can refuse it.
  auto put = checkpoints.Put(
      "/v1/jobs/" + id + "/checkpoints/2?attempt=1",
      {{"Authorization", "Bearer " + token},
       {"X-Checkpoint-Sha256", "089001a35679a33ef3db0ca350db9b9a2f0136e0e327577b04b3b98127470961"}},
      "late", "application/octet-stream");
  ASSERT_TRUE(put);
  EXPECT_THAT(put->status, ::testing::AnyOf(401, 403)) << put->body;
  auto latest = checkpoints.Get("/v1/jobs/" + id + "/checkpoints:latest",
                                {{"Authorization", "Bearer " + token}});
  ASSERT_TRUE(latest);
  EXPECT_THAT(latest->status, ::testing::AnyOf(401, 403)) << latest->body;

  for (const std::string& victim : {trainer, victim_script}) {
    v1::CancelJobRequest cancel;
    cancel.set_name(victim);
    v1::Job cancelled;
    EXPECT_TRUE(
        cluster_->jobs().CancelJob(cluster_->AdminContext().get(), cancel, &cancelled).ok());
  }
}

}  // namespace
}  // namespace gradhub
