#include "gpu_worker/agent/script_preparer.h"

#include <filesystem>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "services/common/grpc_retry.h"

namespace gradhub::agent {
namespace {

constexpr absl::Duration kCredentialTimeout = absl::Seconds(10);

absl::Status Named(const std::string& step, const absl::Status& status) {
  return absl::Status(status.code(), absl::StrCat(step, ": ", status.message()));
}

}  // namespace

ScriptPreparer::ScriptPreparer(const AgentConfig& config, v1::NodeService::StubInterface* stub,
                               CodeCache* code_cache, std::function<void()> on_ready)
    : config_(config), stub_(stub), code_cache_(code_cache), on_ready_(std::move(on_ready)) {}

ScriptPreparer::~ScriptPreparer() {
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

std::optional<absl::StatusOr<PreparedScript>> ScriptPreparer::Poll(
    const v1::RankAssignment& assignment, const std::string& session_id) {
  const RankKey key = KeyOf(assignment);
  absl::MutexLock lock(&mu_);
  for (std::thread& thread : finished_) thread.join();
  finished_.clear();
  auto found = preparations_.find(key);
  if (found == preparations_.end()) {
    auto preparation = std::make_unique<Preparation>();
    Preparation* raw = preparation.get();
    preparations_.emplace(key, std::move(preparation));
    raw->thread = std::thread([this, raw, assignment, session_id] {
      absl::StatusOr<PreparedScript> result = Prepare(assignment, session_id);
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
  absl::StatusOr<PreparedScript> result = std::move(found->second->result);
  finished_.push_back(std::move(found->second->thread));
  preparations_.erase(found);
  return result;
}

uint32_t ScriptPreparer::UidFor(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  uint32_t uid = JobUid(job_id, config_.job_uid_base, config_.job_uid_count);
  const int64_t end = config_.job_uid_base + config_.job_uid_count;
  for (int64_t tries = 0; tries < config_.job_uid_count; ++tries) {
    auto [owner, inserted] = uid_owners_.emplace(uid, job_id);
    if (inserted || owner->second == job_id) return uid;
    uid = uid + 1 < end ? uid + 1 : static_cast<uint32_t>(config_.job_uid_base);
  }
  return uid;  // every uid of the range taken by another job: unreachable in practice
}

absl::StatusOr<std::string> ScriptPreparer::IssueCredential(const v1::RankAssignment& assignment,
                                                            const std::string& session_id) {
  v1::IssueRankCredentialRequest request;
  request.set_node("nodes/" + config_.name);
  request.set_session_id(session_id);
  request.set_job(assignment.job());
  request.set_attempt(assignment.attempt());
  request.set_rank(assignment.rank());
  v1::IssueRankCredentialResponse response;
  grpc::ClientContext context;
  context.AddMetadata("authorization", "Bearer " + config_.token);
  context.set_deadline(absl::ToChronoTime(absl::Now() + kCredentialTimeout));
  const grpc::Status status = stub_->IssueRankCredential(&context, request, &response);
  if (!status.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
  }
  return response.token();
}

absl::StatusOr<PreparedScript> ScriptPreparer::Prepare(const v1::RankAssignment& assignment,
                                                       const std::string& session_id) {
  const v1::ScriptSpec& script = assignment.spec().script();
  absl::StatusOr<RankLaunch> paths = PlanRankPaths(config_, assignment);
  if (!paths.ok()) return paths.status();
  PreparedScript prepared;
  prepared.identity = ScriptIdentity(config_.isolation.identity, UidFor(paths->job_id));  // step 1
  absl::StatusOr<CodeCache::Lease> archive =
      code_cache_->Acquire(script.code(), config_.checkpoint_server);  // step 2
  if (!archive.ok()) return Named("code " + script.code(), archive.status());
  const std::string attempt_dir = std::filesystem::path(paths->dir).parent_path().string();
  absl::StatusOr<std::string> code =
      UnpackAttemptCode(archive->path(), attempt_dir, prepared.identity);
  if (!code.ok()) return Named("unpacking code " + script.code(), code.status());
  prepared.code_dir = *code;
  absl::StatusOr<std::string> token = IssueCredential(assignment, session_id);  // step 3
  if (!token.ok()) return Named("IssueRankCredential", token.status());
  prepared.token = *token;
  return prepared;
}

}  // namespace gradhub::agent
