#include "gpu_worker/agent/rank_launch.h"

#include <google/protobuf/util/json_util.h>

#include <filesystem>
#include <fstream>
#include <system_error>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace gradhub::agent {
namespace {

constexpr char kJobPrefix[] = "jobs/";

// The id becomes a path component: no separators, no "." or "..".
bool PathSafeId(const std::string& id) {
  if (id.empty() || id.size() > 128 || id == "." || id == "..") return false;
  for (char c : id) {
    if (!absl::ascii_isalnum(c) && c != '-' && c != '_' && c != '.') return false;
  }
  return true;
}

}  // namespace

absl::StatusOr<RankLaunch> PlanRankLaunch(const AgentConfig& config, const std::string& session_id,
                                          const v1::RankAssignment& assignment) {
  if (!absl::StartsWith(assignment.job(), kJobPrefix) ||
      !PathSafeId(assignment.job().substr(sizeof(kJobPrefix) - 1))) {
    return absl::InvalidArgumentError(
        absl::StrCat("job: '", assignment.job(), "' is not jobs/<id> with a path-safe id"));
  }
  if (assignment.attempt() < 0 || assignment.rank() < 0) {
    return absl::InvalidArgumentError("attempt and rank must not be negative");
  }
  RankLaunch launch;
  launch.job_id = assignment.job().substr(sizeof(kJobPrefix) - 1);
  const std::filesystem::path work(config.work_dir);
  launch.dir = (work / "jobs" / launch.job_id / absl::StrCat("attempt-", assignment.attempt()) /
                absl::StrCat("rank-", assignment.rank()))
                   .string();
  launch.spec_path = launch.dir + "/spec.json";
  const std::filesystem::path checkpoints = config.checkpoint_root.empty()
                                                ? work / "checkpoints"
                                                : std::filesystem::path(config.checkpoint_root);
  launch.checkpoint_dir = (checkpoints / launch.job_id).string();
  launch.pid_file =
      (work / "pids" /
       absl::StrCat(launch.job_id, ".", assignment.attempt(), ".", assignment.rank(), ".pid"))
          .string();
  launch.argv = {config.trainer};

  for (const auto& [key, value] : assignment.env()) launch.env[key] = value;
  auto& env = launch.env;
  env["GRADHUB_SPEC"] = launch.spec_path;
  env["GRADHUB_RANK"] = absl::StrCat(assignment.rank());
  env["GRADHUB_WORLD_SIZE"] = absl::StrCat(assignment.world_size());
  env["GRADHUB_LOCAL_RANK"] = absl::StrCat(assignment.local_rank());
  env["GRADHUB_LOCAL_WORLD_SIZE"] = absl::StrCat(assignment.local_world_size());
  env["GRADHUB_JOB_ID"] = launch.job_id;
  env["GRADHUB_ATTEMPT"] = absl::StrCat(assignment.attempt());
  env["GRADHUB_STORE"] =
      assignment.store_address().empty() ? "" : "grpc://" + assignment.store_address();
  env["GRADHUB_TOKEN"] = config.token;
  env["GRADHUB_TLS_CA"] = config.tls_ca_file;
  env["GRADHUB_CHECKPOINT_DIR"] = launch.checkpoint_dir;
  env["GRADHUB_CHECKPOINT_SERVER"] = config.checkpoint_server;
  env["GRADHUB_METRICS_SERVER"] = config.metrics_server;
  env["GRADHUB_NODE_NAME"] = config.name;
  env["GRADHUB_NODE_SESSION"] = session_id;
  if (!assignment.device_indices().empty()) {
    env["CUDA_VISIBLE_DEVICES"] = absl::StrJoin(assignment.device_indices(), ",");
  }
  return launch;
}

absl::Status PrepareRankFiles(const RankLaunch& launch, const v1::RankAssignment& assignment) {
  std::error_code error;
  for (const std::string& dir : {launch.dir, launch.checkpoint_dir,
                                 std::filesystem::path(launch.pid_file).parent_path().string()}) {
    std::filesystem::create_directories(dir, error);
    if (error)
      return absl::InternalError(absl::StrCat("cannot create ", dir, ": ", error.message()));
  }
  std::string json;
  google::protobuf::util::JsonPrintOptions print;
  print.add_whitespace = true;
  if (auto status = google::protobuf::util::MessageToJsonString(assignment.spec(), &json, print);
      !status.ok()) {
    return absl::InternalError(absl::StrCat("spec to JSON: ", status.ToString()));
  }
  const std::string tmp = launch.spec_path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << json;
    out.flush();
    if (!out) return absl::InternalError("cannot write " + tmp);
  }
  std::filesystem::rename(tmp, launch.spec_path, error);
  if (error) return absl::InternalError(absl::StrCat("cannot write ", launch.spec_path));
  return absl::OkStatus();
}

}  // namespace gradhub::agent
