// Agent: the node side of the level-triggered heartbeat protocol in nodes.proto.
//
//   1. Run() first kills what a previous incarnation left (leftovers.h, pid files under
//      <work-dir>/pids), then calls RegisterNode until it succeeds (backoff, never gives up)
//      and prints "gradhub-agent: registered as nodes/<name> with N slots".
//   2. Every heartbeat_interval (the server's latest value) it sends Heartbeat with seq + 1
//      and a RankStatus for every rank it knows: running ones and exited ones not yet dropped.
//   3./4. On an answer it reconciles with the desired set (reconcile.h, a pure function):
//      starts never-seen keys, stops running undesired ranks (SIGTERM, SIGKILL after
//      --stop-grace), drops exited undesired ones. A key once started is never started again.
//   5. Beside the heartbeat a WatchAssignments stream (assignment_watch.h, nodes.proto step 8)
//      wakes the loop as soon as the desired set changes; the loop then heartbeats at once and
//      reconciles with that answer, so new work starts without waiting for the interval.
//   6. FAILED_PRECONDITION (session superseded or node LOST): stop every rank, wait for them
//      to exit, forget them (the server already counts them as gone) and register again.
//   7. Errors other than FAILED_PRECONDITION (server unreachable during an api restart,
//      UNAUTHENTICATED, ...) are retried with backoff while the ranks keep running; only once
//      no Heartbeat has succeeded for --api-outage-grace does the agent stop every rank on its
//      own (reconcile.h, "Surviving a control-plane outage"). The agent never exits because of
//      the server.
//
// Threads: Run() is the protocol loop and the only thread that touches the rank table; rank
// processes are forked, read and reaped by RankProcess's supervisor thread; the LogShipper
// and the AssignmentWatch have a thread each. Output flows supervisor thread -> LineCallback ->
// LogShipper buffer -> ReportLogs. Every RPC carries `authorization: Bearer <node token>`.
#pragma once

#include <grpcpp/support/channel_arguments.h>

#include <atomic>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "absl/time/time.h"
#include "gpu_worker/agent/assignment_watch.h"
#include "gpu_worker/agent/config.h"
#include "gpu_worker/agent/log_shipper.h"
#include "gpu_worker/agent/rank_process.h"
#include "gpu_worker/agent/reconcile.h"
#include "gradhub/v1/nodes.grpc.pb.h"

namespace gradhub::agent {

inline constexpr absl::Duration kDefaultHeartbeatInterval = absl::Seconds(5);

// "out of memory: limit N bytes (...)" for a rank the kernel killed at its cgroup's limit.
std::string OutOfMemoryMessage(const RankProcessStatus& status);

// RankStatus for one rank process as the agent reports it.
v1::RankStatus ToRankStatus(const RankKey& key, const RankProcessStatus& status);

// Channel arguments for the agent's connection: reconnect quickly after the server comes back
// (gRPC's default reconnect backoff grows to two minutes, longer than a lease).
grpc::ChannelArguments AgentChannelArguments();

class Agent {
 public:
  // `config` must be complete: absolute work_dir, trainer set (main does that). `stub` is not
  // owned and must outlive the Agent.
  Agent(AgentConfig config, v1::NodeService::StubInterface* stub);
  ~Agent();

  // The protocol loop (see above) until Shutdown(); then stops every rank (grace), waits for
  // them, ships what is left of their output (--shutdown-log-flush) and returns.
  void Run();
  // Any thread; also from a signal-waiting thread.
  void Shutdown();

 private:
  struct Rank {
    v1::RankAssignment assignment;
    std::unique_ptr<RankProcess> process;  // null if it could not be started
    v1::RankStatus failed_to_start;        // the status reported when process is null
    std::string stop_reason;
  };

  bool Register();
  // kOk, kRetry (unreachable etc.) or kSessionEnded (FAILED_PRECONDITION).
  enum class HeartbeatResult { kOk, kRetry, kSessionEnded };
  HeartbeatResult Heartbeat();
  void StartRank(const v1::RankAssignment& assignment);
  void StopAll(const std::string& reason);
  // Waits (bounded by the stop grace plus the drain time) for every rank to exit.
  void WaitAllExited();
  void DropAll();
  bool AnyRunning() const;
  // Ranks whose process has exited; a change since the last heartbeat is reported at once.
  size_t CountExited() const;
  // Sleeps until `deadline`, Shutdown() or news from the AssignmentWatch.
  void SleepUntil(absl::Time deadline);
  // The AssignmentWatch's callback (its thread): a heartbeat is due now.
  void WakeForAssignments();
  void Context(grpc::ClientContext* context, absl::Duration timeout) const;

  const AgentConfig config_;
  v1::NodeService::StubInterface* const stub_;

  std::atomic<bool> shutdown_{false};
  std::atomic<bool> assignments_news_{false};  // set by the watch, cleared before a heartbeat
  std::mutex sleep_mu_;
  std::condition_variable sleep_cv_;

  // Protocol state, Run() thread only.
  std::string node_name_;  // nodes/<name>, as the server stored it
  std::string session_id_;
  bool registered_ = false;
  int64_t seq_ = 0;
  absl::Duration interval_ = kDefaultHeartbeatInterval;
  absl::Time last_heartbeat_ok_ = absl::InfinitePast();
  // The last reconcile started or stopped ranks: report them at once rather than an interval
  // later, so the scheduler sees a started job (or a freed slot) without waiting.
  bool changed_ranks_ = false;
  size_t exited_reported_ = 0;
  grpc::StatusCode last_error_code_ = grpc::StatusCode::OK;
  absl::Time last_error_print_ = absl::InfinitePast();

  // Declared before ranks_: rank processes call into it until they are destroyed.
  LogShipper shipper_;
  std::map<RankKey, Rank> ranks_;
  std::set<RankKey> ever_started_;
  // Last: its thread calls WakeForAssignments, so it is stopped before anything above goes.
  AssignmentWatch watch_;
};

}  // namespace gradhub::agent
