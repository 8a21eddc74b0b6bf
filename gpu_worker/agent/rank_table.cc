#include "gpu_worker/agent/rank_table.h"

#include <google/protobuf/util/time_util.h>

#include <algorithm>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "services/common/contract/trainer_exit_codes.h"

namespace gradhub::agent {
namespace {

using google::protobuf::util::TimeUtil;

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

void RankTable::Report(google::protobuf::RepeatedPtrField<v1::RankStatus>* statuses) const {
  for (const auto& [key, rank] : ranks_) {
    v1::RankStatus* status = statuses->Add();
    if (rank.process == nullptr) {
      *status = rank.failed_to_start;
      continue;
    }
    *status = ToRankStatus(key, rank.process->Status());
    if (status->state() == v1::RankStatus::STOPPED) {
      status->set_message("stopped by the agent: " + rank.stop_reason);
    }
  }
}

ReconcileActions RankTable::Reconcile(
    const google::protobuf::RepeatedPtrField<v1::RankAssignment>& desired,
    const std::set<AttemptKey>& discarded) const {
  std::map<RankKey, KnownRank> known;
  for (const auto& [key, rank] : ranks_) {
    known[key] = {rank.process == nullptr || rank.process->Status().exited,
                  !rank.stop_reason.empty(), rank.killed};
  }
  return agent::Reconcile(desired, known, ever_started_, discarded);
}

void RankTable::Started(const RankKey& key, std::unique_ptr<RankProcess> process) {
  ever_started_.insert(key);
  ranks_[key].process = std::move(process);
}

void RankTable::FailedToStart(const RankKey& key, const absl::Status& error, int exit_code,
                              v1::RankStatus::State state) {
  ever_started_.insert(key);
  const std::string message =
      absl::StrCat("gradhub-agent: cannot start ", key.ToString(), ": ", error.message());
  std::cerr << message << "\n";
  v1::RankStatus& status = ranks_[key].failed_to_start;
  status.set_job(key.job);
  status.set_attempt(key.attempt);
  status.set_rank(key.rank);
  status.set_state(state);
  status.set_exit_code(exit_code);
  status.set_message(message);
  shipper_->Append(key, {OutputStream::kStderr, 1, absl::Now(), message});
  shipper_->Close(key);
}

void RankTable::Stop(const RankKey& key, const std::string& reason) {
  StopWithin(key, reason, stop_grace_);
}

void RankTable::Kill(const RankKey& key, const std::string& reason) {
  StopWithin(key, reason, absl::ZeroDuration());
}

void RankTable::StopWithin(const RankKey& key, const std::string& reason, absl::Duration grace) {
  Rank& rank = ranks_.at(key);
  if (rank.process == nullptr || rank.process->Status().exited) return;
  const bool kill = grace <= absl::ZeroDuration();
  if (kill && !rank.killed) {
    std::cerr << "gradhub-agent: killing " << key.ToString() << " (" << reason << ")\n";
  } else if (!kill && rank.stop_reason.empty()) {
    std::cerr << "gradhub-agent: stopping " << key.ToString() << " (" << reason << ")\n";
  }
  if (rank.stop_reason.empty()) rank.stop_reason = reason;
  rank.killed = rank.killed || kill;
  rank.process->Stop(grace);  // a second call only shortens the grace
}

void RankTable::StopAll(const std::string& reason) {
  for (const auto& [key, rank] : ranks_) Stop(key, reason);
}

void RankTable::WaitAllExited() {
  const absl::Time deadline = absl::Now() + stop_grace_ + kDrainTimeout + absl::Seconds(1);
  for (auto& [key, rank] : ranks_) {
    if (rank.process == nullptr) continue;
    if (!rank.process->Wait(std::max(deadline - absl::Now(), absl::ZeroDuration()))) {
      std::cerr << "gradhub-agent: " << key.ToString() << " (pid " << rank.process->pid()
                << ") has not exited after SIGKILL\n";
    }
  }
}

void RankTable::Drop(const RankKey& key) {
  shipper_->Close(key);  // every line is in the shipper once the process counts as exited
  ranks_.erase(key);
}

void RankTable::DropAll() {
  CloseAllLogs();
  ranks_.clear();  // the keys stay in ever_started_: never started again
}

void RankTable::CloseAllLogs() {
  for (const auto& [key, rank] : ranks_) shipper_->Close(key);
}

bool RankTable::AnyRunning() const {
  for (const auto& [key, rank] : ranks_) {
    if (rank.process != nullptr && rank.stop_reason.empty() && !rank.process->Status().exited) {
      return true;
    }
  }
  return false;
}

size_t RankTable::CountExited() const {
  size_t exited = 0;
  for (const auto& [key, rank] : ranks_) {
    exited += rank.process != nullptr && rank.process->Status().exited;
  }
  return exited;
}

std::set<std::string> RankTable::JobIds() const {
  std::set<std::string> jobs;
  for (const auto& [key, rank] : ranks_) {
    jobs.insert(std::string(absl::StripPrefix(key.job, "jobs/")));
  }
  return jobs;
}

}  // namespace gradhub::agent
