#include "gpu_worker/agent/script_launch.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>

#include "absl/strings/str_cat.h"
#include "gpu_worker/agent/node_address.h"
#include "services/common/code_archive/code_archive.h"
#include "services/common/contract/script_spec.h"

namespace gradhub::agent {
namespace {

absl::Status Own(const std::string& path, uid_t uid, gid_t gid, mode_t mode, bool chown_it) {
  if (chown_it && chown(path.c_str(), uid, gid) != 0) {
    return absl::InternalError(absl::StrCat("cannot chown ", path, ": ", std::strerror(errno)));
  }
  if (chmod(path.c_str(), mode) != 0) {
    return absl::InternalError(absl::StrCat("cannot chmod ", path, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

// torchrun's variables (see PlanScriptLaunch).
void SetTorchrunEnvironment(const v1::RankAssignment& assignment, const std::string& job_id,
                            std::map<std::string, std::string>* env) {
  auto& e = *env;
  e["RANK"] = absl::StrCat(assignment.rank());
  e["WORLD_SIZE"] = absl::StrCat(assignment.world_size());
  e["LOCAL_RANK"] = absl::StrCat(assignment.local_rank());
  e["LOCAL_WORLD_SIZE"] = absl::StrCat(assignment.local_world_size());
  e["GROUP_RANK"] = absl::StrCat(assignment.group_rank());
  e["ROLE_RANK"] = e["RANK"];
  e["ROLE_WORLD_SIZE"] = e["WORLD_SIZE"];
  e["ROLE_NAME"] = "default";
  e["MASTER_ADDR"] = assignment.master_addr();
  e["MASTER_PORT"] = absl::StrCat(assignment.master_port());
  e["TORCHELASTIC_RESTART_COUNT"] = absl::StrCat(std::max(0, assignment.attempt() - 1));
  e["TORCHELASTIC_RUN_ID"] = job_id;
}

}  // namespace

v1::RankAssignment WithLocalRanksDevices(
    const v1::RankAssignment& assignment,
    const google::protobuf::RepeatedPtrField<v1::RankAssignment>& desired) {
  std::map<int32_t, const v1::RankAssignment*> local;  // by local rank
  for (const v1::RankAssignment& other : desired) {
    if (other.job() == assignment.job() && other.attempt() == assignment.attempt()) {
      local[other.local_rank()] = &other;
    }
  }
  v1::RankAssignment widened = assignment;
  if (assignment.device_indices().empty()) return widened;
  widened.clear_device_indices();
  for (const auto& [local_rank, other] : local) {
    for (const int32_t index : other->device_indices()) widened.add_device_indices(index);
  }
  return widened;
}

absl::StatusOr<RankLaunch> PlanScriptLaunch(const AgentConfig& config,
                                            const v1::RankAssignment& assignment,
                                            const PreparedRank& prepared) {
  if (!assignment.spec().has_script()) {
    return absl::InvalidArgumentError("spec: not a script job (script is unset)");
  }
  absl::StatusOr<RankLaunch> planned = PlanRankPaths(config, assignment);
  if (!planned.ok()) return planned.status();
  RankLaunch launch;  // of the paths, a script rank has its directory and pid file only
  launch.job_id = planned->job_id;
  launch.dir = planned->dir;
  launch.pid_file = planned->pid_file;
  const v1::ScriptSpec& script = assignment.spec().script();
  launch.argv = {script.interpreter().empty() ? kDefaultScriptInterpreter : script.interpreter(),
                 prepared.code_dir + "/" + script.entrypoint()};
  launch.argv.insert(launch.argv.end(), script.args().begin(), script.args().end());
  auto& env = launch.env;
  SetTorchrunEnvironment(assignment, launch.job_id, &env);
  for (const auto& [key, value] : config.rank_network_env) env[key] = value;
  SetDistributedEnvironment(config.devices, assignment, &env);
  env["GRADHUB_JOB_ID"] = launch.job_id;
  env["GRADHUB_ATTEMPT"] = absl::StrCat(assignment.attempt());
  env["GRADHUB_RANK"] = env["RANK"];
  env["GRADHUB_WORLD_SIZE"] = env["WORLD_SIZE"];
  env["GRADHUB_JOB_TOKEN"] = prepared.token;
  // gradhub.distributed.init()'s rendezvous, with the job token (scoped by the api to this
  // attempt's keys); empty without a store address, as a trainer rank's.
  env["GRADHUB_STORE"] =
      assignment.store_address().empty()
          ? ""
          : "grpc://" + StoreAddressForRanks(assignment.store_address(), config.server);
  env["GRADHUB_CHECKPOINT_URL"] = config.checkpoint_url;
  env["GRADHUB_METRICS_URL"] = config.metrics_url;
  env["GRADHUB_TLS_CA"] = config.tls_ca_file;
  env["GRADHUB_CODE_DIR"] = prepared.code_dir;
  env["GRADHUB_SEED"] = absl::StrCat(assignment.spec().seed());
  env["PYTHONPATH"] = config.python_dir;
  env["PYTHONUNBUFFERED"] = "1";
  env["HOME"] = launch.dir;
  env["USER"] = env["LOGNAME"] = prepared.identity.name;
  for (const auto& [name, value] : script.env()) {
    if (!IsReservedScriptVariable(name)) env[name] = value;
  }
  return launch;
}

absl::Status PrepareScriptFiles(const RankLaunch& launch, const RankIdentity& identity) {
  std::error_code error;
  for (const std::string& dir :
       {launch.dir, std::filesystem::path(launch.pid_file).parent_path().string()}) {
    std::filesystem::create_directories(dir, error);
    if (error) {
      return absl::InternalError(absl::StrCat("cannot create ", dir, ": ", error.message()));
    }
  }
  if (identity.switch_user) {
    const std::filesystem::path attempt = std::filesystem::path(launch.dir).parent_path();
    for (const std::filesystem::path& dir :
         {attempt.parent_path().parent_path(), attempt.parent_path(), attempt}) {
      if (absl::Status owned = Own(dir.string(), 0, 0, 0711, false); !owned.ok()) return owned;
    }
  }
  return Own(launch.dir, identity.uid, identity.gid, 0700, identity.switch_user);
}

absl::StatusOr<std::string> UnpackAttemptCode(const std::string& archive,
                                              const std::string& attempt_dir,
                                              const RankIdentity& identity) {
  const std::string code = attempt_dir + "/code";
  std::error_code error;
  if (std::filesystem::is_directory(code, error)) return code;
  std::filesystem::create_directories(attempt_dir, error);
  // Unpacked aside and renamed into place: a rank of the attempt never sees half the code, and
  // two ranks preparing at once both end up with the one that won.
  const std::string staging = absl::StrCat(code, ".unpacking-", getpid(), "-", gettid());
  std::filesystem::remove_all(staging, error);
  absl::StatusOr<code::ArchiveSummary> unpacked = code::UnpackArchive(archive, staging);
  if (!unpacked.ok()) return unpacked.status();
  if (absl::Status owned =
          Own(staging, 0, identity.gid, identity.switch_user ? 0750 : 0755, identity.switch_user);
      !owned.ok()) {
    std::filesystem::remove_all(staging, error);
    return owned;
  }
  if (rename(staging.c_str(), code.c_str()) != 0) {
    const int rename_errno = errno;
    std::filesystem::remove_all(staging, error);
    if (!std::filesystem::is_directory(code, error)) {
      return absl::InternalError(
          absl::StrCat("cannot move the code into ", code, ": ", std::strerror(rename_errno)));
    }
  }
  return code;
}

absl::Status CheckMasterPortFree(int port) {
  const int fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::OkStatus();  // no IPv6 here: nothing to check against
  sockaddr_in6 address{};
  address.sin6_family = AF_INET6;
  address.sin6_addr = in6addr_any;
  address.sin6_port = htons(static_cast<uint16_t>(port));
  const int reuse = 1;  // as the script's TCPStore will bind it: TIME_WAIT is no conflict
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &reuse, sizeof(reuse));
  const bool bound = bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0;
  const int bind_errno = errno;
  close(fd);
  if (bound) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat("MASTER_PORT ", port, " is in use on this node (",
                                             std::strerror(bind_errno),
                                             "): keep --master-port-base's range free for ranks"));
}

}  // namespace gradhub::agent
