#include "services/api/replica_signals.h"

#include <iostream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "services/common/job_records.h"

namespace gradhub::api {
namespace {

// A PostgreSQL array literal of `items` (each quoted, so any text survives).
std::string TextArray(const std::vector<std::string>& items) {
  std::string literal = "{";
  for (const std::string& item : items) {
    if (literal.size() > 1) literal += ',';
    absl::StrAppend(&literal, "\"", absl::StrReplaceAll(item, {{"\\", "\\\\"}, {"\"", "\\\""}}),
                    "\"");
  }
  return literal + "}";
}

}  // namespace

ReplicaSignals::ReplicaSignals(db::Pool* pool, ReplicaSignalsOptions options)
    : pool_(pool), options_(std::move(options)), listener_(ListenerOptions()) {}

ReplicaSignals::~ReplicaSignals() { Stop(); }

db::ListenerOptions ReplicaSignals::ListenerOptions() {
  db::ListenerOptions listener;
  listener.connection = options_.connection;
  listener.channels = {ReplicaChannels::kAssignments, ReplicaChannels::kJobsCreated,
                       ReplicaChannels::kNudge};
  listener.on_notification = [this](const std::string& channel, const std::string& payload) {
    Receive(channel, payload);
  };
  listener.on_reconnected = [this] { Reconnected(); };
  return listener;
}

absl::Status ReplicaSignals::Start() {
  if (!options_.on_assignments_changed) {
    return absl::InvalidArgumentError("on_assignments_changed: required");
  }
  if (!options_.on_job_created) return absl::InvalidArgumentError("on_job_created: required");
  if (!options_.on_nudge) return absl::InvalidArgumentError("on_nudge: required");
  if (absl::Status started = listener_.Start(); !started.ok()) return started;
  sender_ = std::thread([this] { SendLoop(); });
  return absl::OkStatus();
}

void ReplicaSignals::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  queued_.notify_all();
  if (sender_.joinable()) sender_.join();
  listener_.Stop();
}

void ReplicaSignals::Receive(const std::string& channel, const std::string& payload) {
  if (channel == ReplicaChannels::kAssignments) {
    options_.on_assignments_changed();
  } else if (channel == ReplicaChannels::kNudge) {
    options_.on_nudge();
  } else if (channel == ReplicaChannels::kJobsCreated) {
    if (HeardOwnJob(payload)) return;  // step 3
    if (!JobId(payload).empty()) {
      options_.on_job_created(payload);
      return;
    }
    // Only the database's users can send; still, a bad name must not reach the scheduler's
    // SQL. A full pass finds whatever was created.
    std::cerr << "gradhub-api: replica signals: " << channel
              << ": not a job name, taken as a nudge: " << payload.substr(0, 80) << "\n";
    options_.on_nudge();
  }
}

void ReplicaSignals::Reconnected() {
  options_.on_assignments_changed();
  options_.on_nudge();
}

void ReplicaSignals::Queue(const std::function<void(Outbox&)>& add) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    add(outbox_);
    if (outbox_.jobs.size() > kMaxQueuedJobs) {
      outbox_.jobs.clear();
      outbox_.nudge = true;  // a pass reads the whole queue
    }
  }
  queued_.notify_one();
}

void ReplicaSignals::PublishAssignmentsChanged() {
  Queue([](Outbox& outbox) { outbox.assignments = true; });
}

void ReplicaSignals::PublishJobCreated(const std::string& name) {
  Queue([&](Outbox& outbox) {
    outbox.jobs.push_back(name);
    if (own_jobs_.size() >= kMaxQueuedJobs) own_jobs_.clear();
    own_jobs_.insert(name);
  });
}

bool ReplicaSignals::HeardOwnJob(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  return own_jobs_.erase(name) > 0;
}

void ReplicaSignals::PublishNudge() {
  Queue([](Outbox& outbox) { outbox.nudge = true; });
}

void ReplicaSignals::SendLoop() {
  bool failing = false;  // logged since the last success
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    queued_.wait(lock, [this] { return stopping_ || !outbox_.empty(); });
    if (outbox_.empty()) return;  // stopping, nothing left to send
    const Outbox outbox = std::exchange(outbox_, Outbox{});
    lock.unlock();
    const absl::Status sent = Send(outbox);
    if (!sent.ok() && !failing) {
      std::cerr << "gradhub-api: replica signals: not sent (the other replicas learn at their"
                   " next pass or heartbeat): "
                << sent << "\n";
    }
    failing = !sent.ok();
    lock.lock();
  }
}

absl::Status ReplicaSignals::Send(const Outbox& outbox) {
  std::vector<std::string> channels;
  std::vector<std::string> payloads;
  auto add = [&](const char* channel, const std::string& payload) {
    channels.emplace_back(channel);
    payloads.push_back(payload);
  };
  if (outbox.assignments) add(ReplicaChannels::kAssignments, "");
  if (outbox.nudge) add(ReplicaChannels::kNudge, "");
  for (const std::string& job : outbox.jobs) add(ReplicaChannels::kJobsCreated, job);
  // One statement, so at most one round trip per burst; Pool::Exec may run it twice after a
  // lost connection, which only duplicates hints.
  return pool_
      ->Exec("SELECT pg_notify(c, p) FROM unnest($1::text[], $2::text[]) AS n(c, p)",
             {TextArray(channels), TextArray(payloads)})
      .status();
}

}  // namespace gradhub::api
