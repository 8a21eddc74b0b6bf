#include "gpu_worker/agent/rank_launch.h"

#include <google/protobuf/util/json_util.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <system_error>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gpu_worker/agent/node_address.h"
#include "services/common/contract/data_paths.h"

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

void SetDistributedEnvironment(const NodeDevices& devices, const v1::RankAssignment& assignment,
                               std::map<std::string, std::string>* env) {
  std::vector<std::string> visible;
  for (const int32_t index : assignment.device_indices()) {
    visible.push_back(index >= 0 && static_cast<size_t>(index) < devices.visible_ids.size()
                          ? devices.visible_ids[index]
                          : absl::StrCat(index));
  }
  (*env)["CUDA_VISIBLE_DEVICES"] = absl::StrJoin(visible, ",");
  const bool cuda = devices.cuda && !visible.empty();
  (*env)["GRADHUB_DEVICE"] = cuda ? "cuda" : "cpu";
  // AUTO is decided here, where the ranks landed: NCCL on a GPU node, Gloo on a CPU node. An
  // explicit choice passes through; the trainer refuses NCCL without a GPU.
  v1::DistributedSpec::Backend backend = assignment.spec().distributed().backend();
  if (backend == v1::DistributedSpec::AUTO) {
    backend = cuda ? v1::DistributedSpec::NCCL : v1::DistributedSpec::GLOO;
  }
  (*env)["GRADHUB_BACKEND"] = v1::DistributedSpec::Backend_Name(backend);
  // In whole seconds, a duration the trainer's --collective-timeout parses (absl's syntax).
  if (const int32_t seconds = assignment.spec().distributed().collective_timeout_seconds();
      seconds > 0) {
    (*env)["GRADHUB_COLLECTIVE_TIMEOUT"] = absl::StrCat(seconds, "s");
  }
}

absl::StatusOr<RankLaunch> PlanRankPaths(const AgentConfig& config,
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
  return launch;
}

absl::StatusOr<RankLaunch> PlanRankLaunch(const AgentConfig& config,
                                          const v1::RankAssignment& assignment,
                                          const PreparedRank& prepared) {
  absl::StatusOr<RankLaunch> planned = PlanRankPaths(config, assignment);
  if (!planned.ok()) return planned.status();
  RankLaunch& launch = *planned;
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
      assignment.store_address().empty()
          ? ""
          : "grpc://" + StoreAddressForRanks(assignment.store_address(), config.server);
  env["GRADHUB_TOKEN"] = prepared.token;  // the job's, never the node's
  env["GRADHUB_TLS_CA"] = config.tls_ca_file;
  env["GRADHUB_CHECKPOINT_DIR"] = launch.checkpoint_dir;
  env["GRADHUB_CHECKPOINT_SERVER"] = config.checkpoint_server;
  env["GRADHUB_METRICS_SERVER"] = config.metrics_server;
  env["GRADHUB_NODE_NAME"] = config.name;
  for (const auto& [key, value] : config.rank_network_env) env[key] = value;
  SetDistributedEnvironment(config.devices, assignment, &env);
  env["GRADHUB_DATA_ROOTS"] = JoinRootList(RankDataRoots(config.isolation, assignment.tenant()));
  env["GRADHUB_MAX_INPUT_BYTES"] = absl::StrCat(config.isolation.max_input_bytes);
  env["GRADHUB_MEMORY_LIMIT_BYTES"] =
      absl::StrCat(RankMemoryLimit(config.isolation, assignment.spec()).value_or(0));
  return planned;
}

namespace {

absl::Status Chown(const std::string& path, const RankIdentity& identity, mode_t mode) {
  if (identity.switch_user && chown(path.c_str(), identity.uid, identity.gid) != 0) {
    return absl::InternalError(absl::StrCat("cannot chown ", path, ": ", std::strerror(errno)));
  }
  if (chmod(path.c_str(), mode) != 0) {
    return absl::InternalError(absl::StrCat("cannot chmod ", path, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

// Everything under `dir` becomes `identity`'s (modes kept): the checkpoints an earlier
// attempt of the job wrote as another uid. Nothing to do unless switching users.
absl::Status ChownContents(const std::string& dir, const RankIdentity& identity) {
  if (!identity.switch_user) return absl::OkStatus();
  std::error_code error;
  for (auto it = std::filesystem::recursive_directory_iterator(dir, error);
       !error && it != std::filesystem::recursive_directory_iterator(); it.increment(error)) {
    if (lchown(it->path().c_str(), identity.uid, identity.gid) != 0) {
      return absl::InternalError(
          absl::StrCat("cannot chown ", it->path().string(), ": ", std::strerror(errno)));
    }
  }
  if (error) return absl::InternalError(absl::StrCat("cannot list ", dir, ": ", error.message()));
  return absl::OkStatus();
}

absl::Status WriteSpec(const std::string& path, const v1::RankAssignment& assignment,
                       const RankIdentity& identity) {
  std::string json;
  google::protobuf::util::JsonPrintOptions print;
  print.add_whitespace = true;
  if (auto status = google::protobuf::util::MessageToJsonString(assignment.spec(), &json, print);
      !status.ok()) {
    return absl::InternalError(absl::StrCat("spec to JSON: ", status.ToString()));
  }
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << json;
    out.flush();
    if (!out) return absl::InternalError("cannot write " + tmp);
  }
  if (absl::Status owned = Chown(tmp, identity, 0600); !owned.ok()) return owned;
  std::error_code error;
  std::filesystem::rename(tmp, path, error);
  if (error) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

}  // namespace

absl::Status PrepareRankFiles(const RankLaunch& launch, const v1::RankAssignment& assignment,
                              const RankIdentity& identity) {
  std::error_code error;
  for (const std::string& dir : {launch.dir, launch.checkpoint_dir,
                                 std::filesystem::path(launch.pid_file).parent_path().string()}) {
    std::filesystem::create_directories(dir, error);
    if (error)
      return absl::InternalError(absl::StrCat("cannot create ", dir, ": ", error.message()));
  }
  if (identity.switch_user) {
    // jobs/<id>/attempt-<n>: root's, enterable by the rank's user, listable by nobody else.
    const std::filesystem::path attempt = std::filesystem::path(launch.dir).parent_path();
    for (const std::filesystem::path& dir :
         {attempt.parent_path().parent_path(), attempt.parent_path(), attempt}) {
      if (chmod(dir.c_str(), 0711) != 0) {
        return absl::InternalError(absl::StrCat("cannot chmod ", dir.string()));
      }
    }
  }
  for (const std::string& dir : {launch.dir, launch.checkpoint_dir}) {
    if (absl::Status owned = Chown(dir, identity, 0700); !owned.ok()) return owned;
  }
  if (absl::Status owned = ChownContents(launch.checkpoint_dir, identity); !owned.ok()) {
    return owned;
  }
  return WriteSpec(launch.spec_path, assignment, identity);
}

absl::Status IsolateRank(const NodeIsolation& isolation, const RankLaunch& launch,
                         const v1::RankAssignment& assignment, RankProcessOptions* options) {
  options->identity = isolation.identity;
  // Its tenant's group opens that tenant's data roots (tenant_roots.h); no other rank has it.
  const gid_t tenant_gid = GidOfTenant(isolation.tenant_roots, assignment.tenant());
  if (tenant_gid != 0 && options->identity.switch_user) {
    options->identity.supplementary_gids.push_back(tenant_gid);
  }
  const absl::StatusOr<int64_t> limit = RankMemoryLimit(isolation, assignment.spec());
  if (!limit.ok() || *limit == 0) return limit.status();
  if (isolation.memory_mechanism == MemoryMechanism::kRlimit) {
    options->rlimit_data_bytes = *limit;
  }
  if (isolation.memory_mechanism != MemoryMechanism::kCgroupV1 &&
      isolation.memory_mechanism != MemoryMechanism::kCgroupV2) {
    return absl::OkStatus();
  }
  absl::StatusOr<std::unique_ptr<MemoryCgroup>> cgroup = MemoryCgroup::Create(
      isolation.memory_mechanism, isolation.cgroup_dir,
      absl::StrCat(launch.job_id, ".", assignment.attempt(), ".", assignment.rank()), *limit);
  if (!cgroup.ok()) return cgroup.status();
  options->memory_cgroup = *std::move(cgroup);
  return absl::OkStatus();
}

}  // namespace gradhub::agent
