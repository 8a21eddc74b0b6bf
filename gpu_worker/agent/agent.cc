#include "gpu_worker/agent/agent.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <filesystem>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "gpu_worker/agent/job_uids.h"
#include "gpu_worker/agent/leftovers.h"
#include "gpu_worker/agent/node_description.h"
#include "gpu_worker/agent/rank_start.h"
#include "services/common/grpc_credentials.h"

namespace gradhub::agent {
namespace {

// How soon after starting or stopping ranks the agent reports them: long enough for a started
// trainer to be a running process.
constexpr absl::Duration kReportChangesAfter = absl::Milliseconds(50);
constexpr absl::Duration kExitPollInterval = absl::Milliseconds(20);

constexpr absl::Duration kRegisterTimeout = absl::Seconds(10);
// Waits between failed registrations and heartbeats: gradhub's retry waits (backoff.h, with
// jitter, so agents that lost the api together come back spread out), starting at 200 ms. A
// failed heartbeat's wait is capped by the heartbeat interval too (HeartbeatRound).
constexpr BackoffPolicy kRegisterBackoff{.initial = std::chrono::milliseconds(200),
                                         .max = std::chrono::seconds(5)};
constexpr BackoffPolicy kHeartbeatBackoff{.initial = std::chrono::milliseconds(200),
                                          .max = std::chrono::minutes(1)};

CodeCacheOptions CodeOptions(const AgentConfig& config) {
  CodeCacheOptions options;
  options.token = config.token;
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      ClientCredentials(config.tls_ca_file, config.tls_cert_file, config.tls_key_file);
  // main has built the api channel with the same file, so this does not fail there.
  if (credentials.ok()) options.credentials = *credentials;
  return options;
}

LogShipperOptions ShipperOptions(const AgentConfig& config) {
  LogShipperOptions options;
  options.token = config.token;
  options.max_buffer_bytes =
      static_cast<size_t>(std::max<int64_t>(config.log_buffer_bytes, 1 << 20));
  return options;
}

}  // namespace

Agent::Agent(AgentConfig config, v1::NodeService::StubInterface* stub)
    : config_(std::move(config)),
      stub_(stub),
      shipper_(stub, ShipperOptions(config_)),
      ranks_(&shipper_, config_.stop_grace),
      code_cache_(config_.work_dir + "/code", CodeOptions(config_)),
      preparer_(config_, stub, &code_cache_, [this] { waker_.Notify(); }),
      watch_(stub, config_.token, [this] { waker_.Notify(); }) {}

Agent::~Agent() = default;

void Agent::Context(grpc::ClientContext* context, absl::Duration timeout) const {
  context->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  context->AddMetadata("authorization", "Bearer " + config_.token);
}

void Agent::CleanUpLeftovers() {
  const std::string pid_dir = (std::filesystem::path(config_.work_dir) / "pids").string();
  const LeftoverReport leftovers = agent::KillLeftovers(pid_dir);
  if (leftovers.files > 0) {
    std::cerr << "gradhub-agent: killed " << leftovers.killed
              << " trainer(s) left by a previous agent (" << leftovers.skipped
              << " already gone)\n";
  }
  // This agent does not know which jobs held which uids: none holds one now (job_uids.h).
  if (!config_.isolation.identity.switch_user) return;
  DisownJobFiles(JobDirectories(config_, ""));
  // What ranks of job uids that no process runs as any more left in shared memory. Looked up
  // for each file, not once before: a rank that started since would have its file taken.
  const UidRange range{config_.job_uid_base, config_.job_uid_count};
  const int removed = RemoveSharedMemoryLeftovers(kSharedMemoryDir, [&](uint32_t owner) {
    return range.Contains(owner) && UidsInUse(range).count(owner) == 0;
  });
  if (removed > 0) {
    std::cerr << "gradhub-agent: removed " << removed << " shared-memory file(s) left in "
              << kSharedMemoryDir << " by ranks that are gone\n";
  }
}

bool Agent::Register() {
  absl::StatusOr<v1::Node> node = DescribeNode(config_);
  if (!node.ok()) {  // main validates the configuration first; this is a safety net
    std::cerr << "gradhub-agent: " << node.status().message() << "\n";
    return false;
  }
  v1::RegisterNodeRequest request;
  *request.mutable_node() = *node;
  request.set_boot_id(BootId());
  v1::RegisterNodeResponse response;
  grpc::ClientContext context;
  Context(&context, kRegisterTimeout);
  const grpc::Status status = stub_->RegisterNode(&context, request, &response);
  if (!status.ok()) {
    if (errors_.ShouldPrint(status.error_code(), absl::Now())) {
      std::cerr << "gradhub-agent: RegisterNode at " << config_.server
                << " failed: " << status.error_code() << " " << status.error_message()
                << " (retrying)\n";
    }
    return false;
  }
  errors_.Recovered();
  session_.Start(response, node->name(), absl::Now());
  watch_.Watch(session_.node_name(), session_.session_id());
  const int slots = response.node().slots() > 0 ? response.node().slots() : node->slots();
  std::cout << "gradhub-agent: registered as " << session_.node_name() << " with " << slots
            << " slots" << std::endl;
  return true;
}

Agent::HeartbeatResult Agent::Heartbeat() {
  v1::HeartbeatRequest request;
  request.set_node(session_.node_name());
  request.set_session_id(session_.session_id());
  request.set_seq(session_.NextSeq());
  ranks_.Report(request.mutable_ranks());
  v1::HeartbeatResponse response;
  grpc::ClientContext context;
  Context(&context, std::clamp(session_.interval(), absl::Seconds(1), absl::Seconds(30)));
  const grpc::Status status = stub_->Heartbeat(&context, request, &response);
  if (!status.ok()) return HeartbeatFailed(status);
  if (errors_.Recovered()) std::cerr << "gradhub-agent: heartbeats succeed again\n";
  session_.HeartbeatSucceeded(response, absl::Now());
  ReconcileWith(response.desired_ranks(), DiscardedAttempts(response.discarded_attempts()));
  return HeartbeatResult::kOk;
}

Agent::HeartbeatResult Agent::HeartbeatFailed(const grpc::Status& status) {
  const bool session_ended = status.error_code() == grpc::StatusCode::FAILED_PRECONDITION;
  if (errors_.ShouldPrint(status.error_code(), absl::Now())) {
    std::cerr << "gradhub-agent: Heartbeat failed: " << status.error_code() << " "
              << status.error_message()
              << (session_ended ? std::string(" (registering again)\n")
                                : absl::StrCat(" (retrying; ranks keep running for up to ",
                                               absl::FormatDuration(config_.api_outage_grace),
                                               " without a heartbeat)\n"));
  }
  return session_ended ? HeartbeatResult::kSessionEnded : HeartbeatResult::kRetry;
}

void Agent::ReconcileWith(const google::protobuf::RepeatedPtrField<v1::RankAssignment>& desired,
                          const std::set<AttemptKey>& discarded) {
  const ReconcileActions actions = ranks_.Reconcile(desired, discarded);
  changed_ranks_ = !actions.stop.empty() || !actions.kill.empty();
  for (const RankKey& key : actions.stop) ranks_.Stop(key, "no longer desired by the server");
  for (const RankKey& key : actions.kill) {
    ranks_.Kill(key, "its attempt failed; the server discards its ranks");
  }
  for (const RankKey& key : actions.drop) ranks_.Drop(key);
  for (const v1::RankAssignment& assignment : actions.start) {
    changed_ranks_ = StartRank(assignment, desired) || changed_ranks_;
  }
}

bool Agent::StartRank(const v1::RankAssignment& assignment,
                      const google::protobuf::RepeatedPtrField<v1::RankAssignment>& desired) {
  const RankKey key = KeyOf(assignment);
  LineCallback on_line = [this, key](const OutputLine& line) { shipper_.Append(key, line); };
  std::optional<absl::StatusOr<PreparedRank>> prepared =
      preparer_.Poll(assignment, session_.session_id(), ranks_.JobIds());
  if (!prepared) return false;  // the key stays unseen: the next reconcile asks again
  RankStart start = assignment.spec().has_script()
                        ? StartScriptProcess(config_, WithLocalRanksDevices(assignment, desired),
                                             *prepared, std::move(on_line))
                        : StartRankProcess(config_, assignment, *prepared, std::move(on_line));
  if (start.process == nullptr) {
    ranks_.FailedToStart(key, start.error, start.exit_code, start.state);
  } else {
    ranks_.Started(key, std::move(start.process));
  }
  return true;
}

std::optional<absl::Time> Agent::HeartbeatRound(Backoff& backoff) {
  const absl::Time started = absl::Now();
  absl::Time next = started + session_.interval();
  waker_.ClearNews();  // this heartbeat's answer covers whatever the watch saw so far
  switch (Heartbeat()) {
    case HeartbeatResult::kOk:
      backoff.Reset();
      next = started + session_.interval();  // the interval the server just sent
      if (changed_ranks_) next = absl::Now() + kReportChangesAfter;
      break;
    case HeartbeatResult::kSessionEnded:
      // Step 6: the server already counts this session's ranks as gone.
      ranks_.StopAll("the server ended this agent's session");
      ranks_.WaitAllExited();
      ranks_.DropAll();
      session_.End();
      return std::nullopt;
    case HeartbeatResult::kRetry:
      next = std::min(absl::Now() + absl::FromChrono(backoff.Next()), next);
      break;
  }
  return next;
}

void Agent::StopIfOutageGraceExpired() {
  // Step 7: an api outage (restart) is ridden out for the grace; past it, stop the ranks.
  if (OutageGraceExpired(session_.SinceSuccess(absl::Now()), config_.api_outage_grace) &&
      ranks_.AnyRunning()) {
    ranks_.StopAll(absl::StrCat("no successful heartbeat for ",
                                absl::FormatDuration(config_.api_outage_grace),
                                " (--api-outage-grace)"));
  }
}

void Agent::SleepUntilDue(absl::Time next) {
  // Or until a rank exits: an exit is news the scheduler acts on (restart, finish), so it goes
  // up at once.
  const size_t exited = ranks_.CountExited();
  while (!waker_.shutdown() && !waker_.news() && absl::Now() < next &&
         ranks_.CountExited() == exited) {
    waker_.SleepUntil(std::min(next, absl::Now() + kExitPollInterval));
  }
}

void Agent::Run() {
  CleanUpLeftovers();
  Backoff register_backoff(kRegisterBackoff);
  Backoff heartbeat_backoff(kHeartbeatBackoff);
  while (!waker_.shutdown()) {
    if (!session_.registered()) {
      if (!Register()) {
        waker_.ClearNews();  // news of a session that is over
        waker_.SleepUntil(absl::Now() + absl::FromChrono(register_backoff.Next()));
        continue;
      }
      register_backoff.Reset();
    }
    const std::optional<absl::Time> next = HeartbeatRound(heartbeat_backoff);
    if (!next.has_value()) continue;  // step 6: register again
    StopIfOutageGraceExpired();
    SleepUntilDue(*next);
  }
  watch_.Stop();
  ranks_.StopAll("the agent is shutting down");
  ranks_.WaitAllExited();
  ranks_.CloseAllLogs();
  if (!shipper_.Flush(config_.shutdown_log_flush)) {
    std::cerr << "gradhub-agent: could not ship all rank output before exiting ("
              << shipper_.stats().buffered_bytes << " bytes left)\n";
  }
}

}  // namespace gradhub::agent
