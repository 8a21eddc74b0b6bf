// The ranks an agent knows (agent.h steps 2 to 4 and 6): those it started, running or exited,
// and those it could not start, each reported in every heartbeat until reconcile drops it; and
// every key ever started, which is never started again (reconcile.h). Each rank's output goes
// to the LogShipper, which is told when a rank is dropped.
//
// Not thread-safe: the protocol loop's (Run()'s thread). The rank processes themselves are
// thread-safe and run their output callbacks on their supervisor thread.
#pragma once

#include <map>
#include <memory>
#include <set>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "gpu_worker/agent/log_shipper.h"
#include "gpu_worker/agent/rank_process.h"
#include "gpu_worker/agent/reconcile.h"
#include "gradhub/v1/nodes.pb.h"

namespace gradhub::agent {

// "out of memory: limit N bytes (...)" for a rank the kernel killed at its cgroup's limit.
std::string OutOfMemoryMessage(const RankProcessStatus& status);

// RankStatus for one rank process as the agent reports it.
v1::RankStatus ToRankStatus(const RankKey& key, const RankProcessStatus& status);

class RankTable {
 public:
  // `shipper` is not owned and must outlive the table. Stop() gives ranks `stop_grace` between
  // SIGTERM and SIGKILL.
  RankTable(LogShipper* shipper, absl::Duration stop_grace)
      : shipper_(shipper), stop_grace_(stop_grace) {}

  // Step 2: a RankStatus for every rank known, appended to `statuses`. A rank the agent
  // stopped says why in its message.
  void Report(google::protobuf::RepeatedPtrField<v1::RankStatus>* statuses) const;
  // Step 4 for the known ranks: what to start, stop, kill and drop (reconcile.h); `discarded`
  // are the answer's discarded_attempts.
  ReconcileActions Reconcile(const google::protobuf::RepeatedPtrField<v1::RankAssignment>& desired,
                             const std::set<AttemptKey>& discarded = {}) const;

  // A key started: its process, or why it could not be started. The failure is reported like
  // a failure of the trainer with `exit_code` (or, with `state` STOPPED, as a rank its agent
  // stopped: the infrastructure's fault whatever the job's exit codes mean), and put in the
  // rank's log so that the job's owner sees why.
  void Started(const RankKey& key, std::unique_ptr<RankProcess> process);
  void FailedToStart(const RankKey& key, const absl::Status& error, int exit_code,
                     v1::RankStatus::State state = v1::RankStatus::FAILED);

  // SIGTERM now, SIGKILL after the stop grace, unless it has exited; `reason` is reported in
  // its message (the first reason given stays).
  void Stop(const RankKey& key, const std::string& reason);
  // SIGKILL now (nodes.proto step 4a), also after a Stop() whose grace has not run out; as
  // Stop(), `reason` is reported unless an earlier one was given.
  void Kill(const RankKey& key, const std::string& reason);
  void StopAll(const std::string& reason);
  // Waits (bounded by the stop grace plus the drain time) for every rank to exit.
  void WaitAllExited();
  // Stops reporting the rank (its key stays ever started); its output is shipped and forgotten.
  void Drop(const RankKey& key);
  void DropAll();
  // Every rank's output is complete (the agent is exiting): the shipper may forget each rank
  // once shipped.
  void CloseAllLogs();

  // Some rank runs and was not asked to stop.
  bool AnyRunning() const;
  // Ranks whose process has exited; a change is news the agent reports at once.
  size_t CountExited() const;
  // The ids (uuids, without "jobs/") of the jobs of every rank known: their uids stay theirs
  // (job_uids.h rule 4).
  std::set<std::string> JobIds() const;

 private:
  struct Rank {
    std::unique_ptr<RankProcess> process;  // null if it could not be started
    v1::RankStatus failed_to_start;        // the status reported when process is null
    std::string stop_reason;
    bool killed = false;  // Kill() sent
  };

  // Stop() with `grace`: zero for Kill().
  void StopWithin(const RankKey& key, const std::string& reason, absl::Duration grace);

  LogShipper* const shipper_;
  const absl::Duration stop_grace_;
  std::map<RankKey, Rank> ranks_;
  std::set<RankKey> ever_started_;
};

}  // namespace gradhub::agent
