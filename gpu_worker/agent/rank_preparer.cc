#include "gpu_worker/agent/rank_preparer.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "gpu_worker/agent/script_launch.h"

namespace gradhub::agent {
namespace {

constexpr absl::Duration kCredentialTimeout = absl::Seconds(10);

absl::Status Named(const std::string& step, const absl::Status& status) {
  return absl::Status(status.code(), absl::StrCat(step, ": ", status.message()));
}

std::string CheckpointRoot(const AgentConfig& config) {
  return config.checkpoint_root.empty() ? config.work_dir + "/checkpoints" : config.checkpoint_root;
}

}  // namespace

std::vector<std::string> JobDirectories(const AgentConfig& config, const std::string& job_id) {
  std::vector<std::string> dirs = {config.work_dir + "/jobs/" + job_id};
  if (!config.checkpoint_server.empty()) dirs.push_back(CheckpointRoot(config) + "/" + job_id);
  return dirs;
}

RankPreparer::RankPreparer(const AgentConfig& config, v1::NodeService::StubInterface* stub,
                           CodeCache* code_cache, std::function<void()> on_ready)
    : config_(config),
      stub_(stub),
      code_cache_(code_cache),
      on_ready_(std::move(on_ready)),
      uids_(UidRange{config.job_uid_base, config.job_uid_count},
            [&config](const std::string& job_id, uint32_t uid) {
              DisownJobFiles(JobDirectories(config, job_id));
              RemoveSharedMemoryLeftovers(kSharedMemoryDir,
                                          [uid](uint32_t owner) { return owner == uid; });
            }) {}

RankPreparer::~RankPreparer() {
  stopping_.Notify();
  std::map<RankKey, std::unique_ptr<Preparation>> preparations;
  std::vector<std::thread> finished;
  {
    absl::MutexLock lock(&mu_);
    preparations.swap(preparations_);
    finished.swap(finished_);
  }
  for (auto& [key, preparation] : preparations) {
    if (preparation->thread.joinable()) preparation->thread.join();
  }
  for (std::thread& thread : finished) thread.join();
}

std::optional<absl::StatusOr<PreparedRank>> RankPreparer::Poll(
    const v1::RankAssignment& assignment, const std::string& session_id,
    const std::set<std::string>& known_jobs) {
  const RankKey key = KeyOf(assignment);
  absl::MutexLock lock(&mu_);
  for (std::thread& thread : finished_) thread.join();
  finished_.clear();
  auto found = preparations_.find(key);
  if (found == preparations_.end()) {
    std::set<std::string> active_jobs = known_jobs;  // and those being prepared (rule 4)
    for (const auto& [other, preparation] : preparations_) active_jobs.insert(preparation->job_id);
    auto preparation = std::make_unique<Preparation>();
    Preparation* raw = preparation.get();
    raw->job_id = std::string(absl::StripPrefix(assignment.job(), "jobs/"));
    preparations_.emplace(key, std::move(preparation));
    raw->thread = std::thread([this, raw, assignment, session_id, active_jobs] {
      absl::StatusOr<PreparedRank> result = Prepare(assignment, session_id, active_jobs);
      {
        absl::MutexLock lock(&mu_);
        raw->result = std::move(result);
        raw->done = true;
      }
      if (on_ready_) on_ready_();
    });
    return std::nullopt;
  }
  if (!found->second->done) return std::nullopt;
  absl::StatusOr<PreparedRank> result = std::move(found->second->result);
  finished_.push_back(std::move(found->second->thread));
  preparations_.erase(found);
  return result;
}

absl::StatusOr<RankIdentity> RankPreparer::IdentityOf(const std::string& job_id,
                                                      const std::set<std::string>& active_jobs) {
  const RankIdentity& node = config_.isolation.identity;
  if (!node.switch_user) return node;  // a non-root agent runs every rank as itself
  absl::StatusOr<uint32_t> uid = uids_.Acquire(job_id, active_jobs);
  if (!uid.ok()) return Named("job uid", uid.status());
  return JobIdentity(node, *uid);
}

absl::Status RankPreparer::UnpackCode(const v1::RankAssignment& assignment, const RankLaunch& paths,
                                      PreparedRank* prepared) {
  const std::string& code = assignment.spec().script().code();
  absl::StatusOr<CodeCache::Lease> archive = code_cache_->Acquire(code, config_.checkpoint_server);
  if (!archive.ok()) return Named("code " + code, archive.status());
  const std::string attempt_dir = std::filesystem::path(paths.dir).parent_path().string();
  absl::StatusOr<std::string> unpacked =
      UnpackAttemptCode(archive->path(), attempt_dir, prepared->identity);
  if (!unpacked.ok()) return Named("unpacking code " + code, unpacked.status());
  prepared->code_dir = *unpacked;
  return absl::OkStatus();
}

absl::StatusOr<std::string> IssueRankCredential(v1::NodeService::StubInterface& stub,
                                                const v1::IssueRankCredentialRequest& request,
                                                const std::string& node_token,
                                                absl::Duration try_timeout, absl::Duration patience,
                                                const absl::Notification& stopping) {
  const absl::Time give_up = absl::Now() + patience;
  absl::Duration backoff = absl::Milliseconds(100);
  while (true) {
    v1::IssueRankCredentialResponse response;
    grpc::ClientContext context;
    context.AddMetadata("authorization", "Bearer " + node_token);
    context.set_deadline(absl::ToChronoTime(absl::Now() + try_timeout));
    const grpc::Status status = stub.IssueRankCredential(&context, request, &response);
    if (status.ok()) return response.token();
    const bool unreachable = status.error_code() == grpc::StatusCode::UNAVAILABLE;
    if (!unreachable || absl::Now() + backoff >= give_up ||
        stopping.WaitForNotificationWithTimeout(backoff)) {
      // The node's failure whatever the api's code (a rank no longer live is NOT_FOUND there):
      // never the user's, which NOT_FOUND and INVALID_ARGUMENT mean to StartScriptProcess.
      return absl::UnavailableError(
          absl::StrCat("IssueRankCredential: ",
                       absl::StatusCodeToString(static_cast<absl::StatusCode>(status.error_code())),
                       " ", status.error_message()));
    }
    backoff = std::min(backoff * 2, absl::Seconds(1));
  }
}

absl::StatusOr<std::string> RankPreparer::IssueCredential(const v1::RankAssignment& assignment,
                                                          const std::string& session_id) {
  v1::IssueRankCredentialRequest request;
  request.set_node("nodes/" + config_.name);
  request.set_session_id(session_id);
  request.set_job(assignment.job());
  request.set_attempt(assignment.attempt());
  request.set_rank(assignment.rank());
  return IssueRankCredential(*stub_, request, config_.token, kCredentialTimeout,
                             config_.api_outage_grace, stopping_);
}

absl::StatusOr<PreparedRank> RankPreparer::Prepare(const v1::RankAssignment& assignment,
                                                   const std::string& session_id,
                                                   const std::set<std::string>& active_jobs) {
  absl::StatusOr<RankLaunch> paths = PlanRankPaths(config_, assignment);
  if (!paths.ok()) return paths.status();
  PreparedRank prepared;
  absl::StatusOr<RankIdentity> identity = IdentityOf(paths->job_id, active_jobs);  // step 1
  if (!identity.ok()) return identity.status();
  prepared.identity = *identity;
  if (assignment.spec().has_script()) {  // step 2
    if (absl::Status code = UnpackCode(assignment, *paths, &prepared); !code.ok()) return code;
  }
  absl::StatusOr<std::string> token = IssueCredential(assignment, session_id);  // step 3
  if (!token.ok()) return token.status();
  prepared.token = *token;
  return prepared;
}

}  // namespace gradhub::agent
