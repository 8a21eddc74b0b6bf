#include "gpu_worker/agent/agent.h"

#include <google/protobuf/util/time_util.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <filesystem>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "gpu_worker/agent/leftovers.h"
#include "gpu_worker/agent/node_description.h"
#include "gpu_worker/agent/rank_launch.h"
#include "services/common/contract/trainer_exit_codes.h"

namespace gradhub::agent {
namespace {

// How soon after starting or stopping ranks the agent reports them: long enough for a started
// trainer to be a running process.
constexpr absl::Duration kReportChangesAfter = absl::Milliseconds(50);
constexpr absl::Duration kExitPollInterval = absl::Milliseconds(20);

using google::protobuf::util::TimeUtil;

constexpr absl::Duration kRegisterTimeout = absl::Seconds(10);
constexpr absl::Duration kInitialBackoff = absl::Milliseconds(200);
constexpr absl::Duration kMaxRegisterBackoff = absl::Seconds(5);
// Bounds on the server's heartbeat_interval, so a bad value cannot spin or stall the agent.
constexpr absl::Duration kMinInterval = absl::Milliseconds(100);
constexpr absl::Duration kMaxInterval = absl::Minutes(5);
// Errors are printed when they change, and otherwise this often.
constexpr absl::Duration kErrorPrintEvery = absl::Seconds(30);

v1::RankStatus::State ToProto(RankState state) {
  switch (state) {
    case RankState::kStarting:
      return v1::RankStatus::STARTING;
    case RankState::kRunning:
      return v1::RankStatus::RUNNING;
    case RankState::kSucceeded:
      return v1::RankStatus::SUCCEEDED;
    case RankState::kFailed:
      return v1::RankStatus::FAILED;
    case RankState::kStopped:
      return v1::RankStatus::STOPPED;
  }
  return v1::RankStatus::STATE_UNSPECIFIED;
}

absl::Duration IntervalFrom(const google::protobuf::Duration& proto) {
  const absl::Duration interval = absl::Seconds(proto.seconds()) + absl::Nanoseconds(proto.nanos());
  if (interval <= absl::ZeroDuration()) return kDefaultHeartbeatInterval;
  return std::clamp(interval, kMinInterval, kMaxInterval);
}

}  // namespace

std::string OutOfMemoryMessage(const RankProcessStatus& status) {
  return absl::StrCat("out of memory: limit ", status.memory_limit_bytes,
                      " bytes (the kernel stopped the rank at its memory cgroup's limit",
                      status.memory_peak_bytes > 0
                          ? absl::StrCat("; peak ", status.memory_peak_bytes, " bytes")
                          : "",
                      ")");
}

v1::RankStatus ToRankStatus(const RankKey& key, const RankProcessStatus& status) {
  v1::RankStatus proto;
  proto.set_job(key.job);
  proto.set_attempt(key.attempt);
  proto.set_rank(key.rank);
  proto.set_pid(status.pid);
  proto.set_state(ToProto(status.state));
  proto.set_last_step(status.last_step);
  if (status.last_step_time != absl::InfinitePast()) {
    *proto.mutable_last_step_time() =
        TimeUtil::NanosecondsToTimestamp(absl::ToUnixNanos(status.last_step_time));
  }
  if (status.exited) {
    proto.set_exit_code(status.exit_code);
    proto.set_signal(status.signal);
    if (status.state == RankState::kFailed && status.out_of_memory) {
      // The kernel killed it at its cgroup's limit: the trainer had no chance to say so.
      proto.set_exit_code(trainer::kExitOutOfMemory);
      proto.set_message(OutOfMemoryMessage(status));
    } else if (status.state == RankState::kFailed) {
      proto.set_message(!status.last_stderr_line.empty() ? status.last_stderr_line
                        : status.signal != 0 ? absl::StrCat("killed by signal ", status.signal)
                                             : absl::StrCat("exited with code ", status.exit_code));
    }
  }
  return proto;
}

grpc::ChannelArguments AgentChannelArguments() {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 200);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 200);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  return args;
}

Agent::Agent(AgentConfig config, v1::NodeService::StubInterface* stub)
    : config_(std::move(config)),
      stub_(stub),
      shipper_(stub,
               [&] {
                 LogShipperOptions options;
                 options.token = config_.token;
                 options.max_buffer_bytes =
                     static_cast<size_t>(std::max<int64_t>(config_.log_buffer_bytes, 1 << 20));
                 return options;
               }()),
      watch_(stub, config_.token, [this] { WakeForAssignments(); }) {}

Agent::~Agent() = default;

void Agent::Shutdown() {
  std::lock_guard<std::mutex> lock(sleep_mu_);
  shutdown_ = true;
  sleep_cv_.notify_all();
}

void Agent::SleepUntil(absl::Time deadline) {
  std::unique_lock<std::mutex> lock(sleep_mu_);
  sleep_cv_.wait_until(lock, absl::ToChronoTime(deadline),
                       [&] { return shutdown_.load() || assignments_news_.load(); });
}

void Agent::WakeForAssignments() {
  std::lock_guard<std::mutex> lock(sleep_mu_);
  assignments_news_ = true;
  sleep_cv_.notify_all();
}

void Agent::Context(grpc::ClientContext* context, absl::Duration timeout) const {
  context->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  context->AddMetadata("authorization", "Bearer " + config_.token);
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
    const absl::Time now = absl::Now();
    if (status.error_code() != last_error_code_ || now - last_error_print_ > kErrorPrintEvery) {
      std::cerr << "gradhub-agent: RegisterNode at " << config_.server
                << " failed: " << status.error_code() << " " << status.error_message()
                << " (retrying)\n";
      last_error_code_ = status.error_code();
      last_error_print_ = now;
    }
    return false;
  }
  last_error_code_ = grpc::StatusCode::OK;
  node_name_ = response.node().name().empty() ? node->name() : response.node().name();
  session_id_ = response.session_id();
  interval_ = IntervalFrom(response.heartbeat_interval());
  seq_ = 0;
  registered_ = true;
  last_heartbeat_ok_ = absl::Now();
  watch_.Watch(node_name_, session_id_);
  const int slots = response.node().slots() > 0 ? response.node().slots() : node->slots();
  std::cout << "gradhub-agent: registered as " << node_name_ << " with " << slots << " slots"
            << std::endl;
  return true;
}

Agent::HeartbeatResult Agent::Heartbeat() {
  v1::HeartbeatRequest request;
  request.set_node(node_name_);
  request.set_session_id(session_id_);
  // A new seq for every request, retries included: the server then processes each one it
  // receives in order and ignores only late duplicates (step 5).
  request.set_seq(++seq_);
  for (const auto& [key, rank] : ranks_) {
    v1::RankStatus* status = request.add_ranks();
    if (rank.process == nullptr) {
      *status = rank.failed_to_start;
      continue;
    }
    *status = ToRankStatus(key, rank.process->Status());
    if (status->state() == v1::RankStatus::STOPPED) {
      status->set_message("stopped by the agent: " + rank.stop_reason);
    }
  }
  v1::HeartbeatResponse response;
  grpc::ClientContext context;
  Context(&context, std::clamp(interval_, absl::Seconds(1), absl::Seconds(30)));
  const grpc::Status status = stub_->Heartbeat(&context, request, &response);
  if (!status.ok()) {
    const absl::Time now = absl::Now();
    if (status.error_code() != last_error_code_ || now - last_error_print_ > kErrorPrintEvery) {
      std::cerr << "gradhub-agent: Heartbeat failed: " << status.error_code() << " "
                << status.error_message()
                << (status.error_code() == grpc::StatusCode::FAILED_PRECONDITION
                        ? std::string(" (registering again)\n")
                        : absl::StrCat(" (retrying; ranks keep running for up to ",
                                       absl::FormatDuration(config_.api_outage_grace),
                                       " without a heartbeat)\n"));
      last_error_code_ = status.error_code();
      last_error_print_ = now;
    }
    return status.error_code() == grpc::StatusCode::FAILED_PRECONDITION
               ? HeartbeatResult::kSessionEnded
               : HeartbeatResult::kRetry;
  }
  if (last_error_code_ != grpc::StatusCode::OK) {
    std::cerr << "gradhub-agent: heartbeats succeed again\n";
    last_error_code_ = grpc::StatusCode::OK;
  }
  last_heartbeat_ok_ = absl::Now();
  interval_ = IntervalFrom(response.heartbeat_interval());

  std::map<RankKey, KnownRank> known;
  for (const auto& [key, rank] : ranks_) {
    known[key] = {rank.process == nullptr || rank.process->Status().exited,
                  !rank.stop_reason.empty()};
  }
  const ReconcileActions actions = Reconcile(response.desired_ranks(), known, ever_started_);
  changed_ranks_ = !actions.start.empty() || !actions.stop.empty();
  for (const RankKey& key : actions.stop) {
    Rank& rank = ranks_.at(key);
    rank.stop_reason = "no longer desired by the server";
    rank.process->Stop(config_.stop_grace);
    std::cerr << "gradhub-agent: stopping " << key.ToString() << " (no longer desired)\n";
  }
  for (const RankKey& key : actions.drop) {
    shipper_.Close(key);  // every line is in the shipper once the process counts as exited
    ranks_.erase(key);
  }
  for (const v1::RankAssignment& assignment : actions.start) StartRank(assignment);
  return HeartbeatResult::kOk;
}

void Agent::StartRank(const v1::RankAssignment& assignment) {
  const RankKey key = KeyOf(assignment);
  ever_started_.insert(key);
  Rank& rank = ranks_[key];
  rank.assignment = assignment;
  auto fail = [&](const absl::Status& error, int exit_code = trainer::kExitInfrastructure) {
    const std::string message =
        absl::StrCat("gradhub-agent: cannot start ", key.ToString(), ": ", error.message());
    std::cerr << message << "\n";
    // Reported like a failure of the trainer with `exit_code` (infrastructure unless the spec
    // is at fault), and put in the rank's log so the job's owner sees why.
    v1::RankStatus& status = rank.failed_to_start;
    status.set_job(key.job);
    status.set_attempt(key.attempt);
    status.set_rank(key.rank);
    status.set_state(v1::RankStatus::FAILED);
    status.set_exit_code(exit_code);
    status.set_message(message);
    shipper_.Append(key, {OutputStream::kStderr, 1, absl::Now(), message});
    shipper_.Close(key);
  };
  absl::StatusOr<RankLaunch> launch = PlanRankLaunch(config_, session_id_, assignment);
  if (!launch.ok()) return fail(launch.status());
  // A path out of this node's data roots, or a file it will not read: the spec's fault, found
  // before anything is created (isolation.h); the trainer checks again on what it opens.
  if (std::string problem = CheckSpecInputs(config_.isolation, assignment.spec());
      !problem.empty()) {
    return fail(absl::InvalidArgumentError(problem), trainer::kExitUserError);
  }
  if (absl::Status prepared = PrepareRankFiles(*launch, assignment, config_.isolation.identity);
      !prepared.ok()) {
    return fail(prepared);
  }
  RankProcessOptions options;
  options.argv = launch->argv;
  options.env = launch->env;
  options.working_dir = launch->dir;
  options.pid_file = launch->pid_file;
  options.on_line = [this, key](const OutputLine& line) { shipper_.Append(key, line); };
  if (absl::Status isolated = IsolateRank(config_.isolation, *launch, assignment, &options);
      !isolated.ok()) {
    return fail(isolated);
  }
  absl::StatusOr<std::unique_ptr<RankProcess>> process = RankProcess::Start(std::move(options));
  if (!process.ok()) return fail(process.status());
  rank.process = *std::move(process);
  std::cerr << "gradhub-agent: started " << key.ToString() << " as pid " << rank.process->pid()
            << " in " << launch->dir << " (GRADHUB_DEVICE=" << launch->env.at("GRADHUB_DEVICE")
            << " CUDA_VISIBLE_DEVICES=" << launch->env.at("CUDA_VISIBLE_DEVICES")
            << " GRADHUB_BACKEND=" << launch->env.at("GRADHUB_BACKEND") << ")\n";
}

void Agent::StopAll(const std::string& reason) {
  for (auto& [key, rank] : ranks_) {
    if (rank.process == nullptr || rank.process->Status().exited) continue;
    if (rank.stop_reason.empty()) {
      rank.stop_reason = reason;
      std::cerr << "gradhub-agent: stopping " << key.ToString() << " (" << reason << ")\n";
    }
    rank.process->Stop(config_.stop_grace);
  }
}

void Agent::WaitAllExited() {
  const absl::Time deadline = absl::Now() + config_.stop_grace + kDrainTimeout + absl::Seconds(1);
  for (auto& [key, rank] : ranks_) {
    if (rank.process == nullptr) continue;
    if (!rank.process->Wait(std::max(deadline - absl::Now(), absl::ZeroDuration()))) {
      std::cerr << "gradhub-agent: " << key.ToString() << " (pid " << rank.process->pid()
                << ") has not exited after SIGKILL\n";
    }
  }
}

void Agent::DropAll() {
  for (const auto& [key, rank] : ranks_) shipper_.Close(key);
  ranks_.clear();  // the keys stay in ever_started_: never started again
}

size_t Agent::CountExited() const {
  size_t exited = 0;
  for (const auto& [key, rank] : ranks_) {
    exited += rank.process != nullptr && rank.process->Status().exited;
  }
  return exited;
}

bool Agent::AnyRunning() const {
  for (const auto& [key, rank] : ranks_) {
    if (rank.process != nullptr && rank.stop_reason.empty() && !rank.process->Status().exited) {
      return true;
    }
  }
  return false;
}

void Agent::Run() {
  const std::string pid_dir = (std::filesystem::path(config_.work_dir) / "pids").string();
  const LeftoverReport leftovers = KillLeftovers(pid_dir);
  if (leftovers.files > 0) {
    std::cerr << "gradhub-agent: killed " << leftovers.killed
              << " trainer(s) left by a previous agent (" << leftovers.skipped
              << " already gone)\n";
  }
  absl::Duration register_backoff = kInitialBackoff;
  absl::Duration heartbeat_backoff = kInitialBackoff;
  while (!shutdown_) {
    if (!registered_) {
      if (!Register()) {
        assignments_news_ = false;  // news of a session that is over
        SleepUntil(absl::Now() + register_backoff);
        register_backoff = std::min(register_backoff * 2, kMaxRegisterBackoff);
        continue;
      }
      register_backoff = kInitialBackoff;
    }
    const absl::Time started = absl::Now();
    absl::Time next = started + interval_;
    assignments_news_ = false;  // this heartbeat's answer covers whatever the watch saw so far
    switch (Heartbeat()) {
      case HeartbeatResult::kOk:
        heartbeat_backoff = kInitialBackoff;
        next = started + interval_;  // the interval the server just sent
        if (changed_ranks_) next = absl::Now() + kReportChangesAfter;
        break;
      case HeartbeatResult::kSessionEnded:
        // Step 6: the server already counts this session's ranks as gone.
        StopAll("the server ended this agent's session");
        WaitAllExited();
        DropAll();
        registered_ = false;
        continue;
      case HeartbeatResult::kRetry:
        next = std::min(absl::Now() + heartbeat_backoff, next);
        heartbeat_backoff = std::min(heartbeat_backoff * 2, interval_);
        break;
    }
    // Step 7: an api outage (restart) is ridden out for the grace; past it, stop the ranks.
    if (OutageGraceExpired(absl::Now() - last_heartbeat_ok_, config_.api_outage_grace) &&
        AnyRunning()) {
      StopAll(absl::StrCat("no successful heartbeat for ",
                           absl::FormatDuration(config_.api_outage_grace),
                           " (--api-outage-grace)"));
    }
    // Until the next heartbeat is due, or a rank exits: an exit is news the scheduler acts on
    // (restart, finish), so it goes up at once.
    exited_reported_ = CountExited();
    while (!shutdown_ && !assignments_news_ && absl::Now() < next &&
           CountExited() == exited_reported_) {
      SleepUntil(std::min(next, absl::Now() + kExitPollInterval));
    }
  }
  watch_.Stop();
  StopAll("the agent is shutting down");
  WaitAllExited();
  for (const auto& [key, rank] : ranks_) shipper_.Close(key);
  if (!shipper_.Flush(config_.shutdown_log_flush)) {
    std::cerr << "gradhub-agent: could not ship all rank output before exiting ("
              << shipper_.stats().buffered_bytes << " bytes left)\n";
  }
}

}  // namespace gradhub::agent
