// Agent: the node side of the level-triggered heartbeat protocol in nodes.proto.
//
//   1. Run() first kills what a previous incarnation left (leftovers.h, pid files under
//      <work-dir>/pids) and gives the directories of its jobs to root (their uids may go to
//      other jobs now: job_uids.h), then calls RegisterNode until it succeeds (backoff, never
//      gives up) and prints "gradhub-agent: registered as nodes/<name> with N slots".
//   2. Every heartbeat_interval (the server's latest value) it sends Heartbeat with seq + 1
//      and a RankStatus for every rank it knows: running ones and exited ones not yet dropped.
//   3./4. On an answer it reconciles with the desired set (reconcile.h, a pure function):
//      starts never-seen keys, stops running undesired ranks (SIGTERM, SIGKILL after
//      --stop-grace; SIGKILL at once for a rank of an attempt the answer names in
//      discarded_attempts: a failed attempt's survivors), drops exited undesired ones. A key
//      once started is never started again.
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
// Its parts: NodeSession (the registration, seq and interval) and RpcErrorLog (node_session.h),
// RankTable (the ranks known, rank_table.h), RankPreparer (a rank's uid and job token,
// rank_preparer.h), StartRankProcess (rank_start.h), Reconcile (reconcile.h), LoopWaker (what
// ends a sleep, loop_waker.h), AssignmentWatch, LogShipper.
//
// Threads: Run() is the protocol loop and the only thread that touches the session and the rank
// table; rank processes are forked, read and reaped by RankProcess's supervisor thread; the
// LogShipper and the AssignmentWatch have a thread each. Output flows supervisor thread ->
// LineCallback -> LogShipper buffer -> ReportLogs. Every RPC carries
// `authorization: Bearer <node token>`. Shutdown() may come from any thread.
#pragma once

#include <grpcpp/support/channel_arguments.h>

#include <optional>

#include "absl/time/time.h"
#include "gpu_worker/agent/assignment_watch.h"
#include "gpu_worker/agent/code_cache.h"
#include "gpu_worker/agent/config.h"
#include "gpu_worker/agent/log_shipper.h"
#include "gpu_worker/agent/loop_waker.h"
#include "gpu_worker/agent/node_session.h"
#include "gpu_worker/agent/rank_preparer.h"
#include "gpu_worker/agent/rank_table.h"
#include "gpu_worker/agent/reconcile.h"
#include "gradhub/v1/nodes.grpc.pb.h"
#include "services/common/backoff.h"

namespace gradhub::agent {

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
  void Shutdown() { waker_.Shutdown(); }

 private:
  // kOk, kRetry (unreachable etc.) or kSessionEnded (FAILED_PRECONDITION).
  enum class HeartbeatResult { kOk, kRetry, kSessionEnded };

  // Step 1.
  void CleanUpLeftovers();
  bool Register();
  // Steps 2 to 4 and 6: one heartbeat and what its answer asks for. When the next one is due
  // (sooner after a change or a failure, `backoff` growing with failures); nullopt when the
  // session ended and the agent registers again.
  std::optional<absl::Time> HeartbeatRound(Backoff& backoff);
  HeartbeatResult Heartbeat();
  HeartbeatResult HeartbeatFailed(const grpc::Status& status);
  // Step 4 with the desired set and the discarded attempts of a heartbeat's answer.
  void ReconcileWith(const google::protobuf::RepeatedPtrField<v1::RankAssignment>& desired,
                     const std::set<AttemptKey>& discarded);
  // True when it started a process or reported a failure to start; false while the rank is
  // still being prepared (its job's uid, its job token, a script's code: rank_preparer.h).
  // `desired` is the whole set it came in (a script rank sees its attempt's local GPUs).
  bool StartRank(const v1::RankAssignment& assignment,
                 const google::protobuf::RepeatedPtrField<v1::RankAssignment>& desired);
  // Step 7.
  void StopIfOutageGraceExpired();
  // Until `next`, Shutdown(), news from the watch or a rank's exit.
  void SleepUntilDue(absl::Time next);
  void Context(grpc::ClientContext* context, absl::Duration timeout) const;

  const AgentConfig config_;
  v1::NodeService::StubInterface* const stub_;
  LoopWaker waker_;

  // Run()'s thread only.
  NodeSession session_;
  RpcErrorLog errors_;
  // The last reconcile started or stopped ranks: report them at once rather than an interval
  // later, so the scheduler sees a started job (or a freed slot) without waiting.
  bool changed_ranks_ = false;

  // Declared before ranks_: rank processes call into it until they are destroyed.
  LogShipper shipper_;
  RankTable ranks_;
  // Script jobs' code archives, and every rank prepared off this loop.
  CodeCache code_cache_;
  RankPreparer preparer_;
  // Last: its thread calls waker_.Notify(), so it is stopped before anything above goes.
  AssignmentWatch watch_;
};

}  // namespace gradhub::agent
