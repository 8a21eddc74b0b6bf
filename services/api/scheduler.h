// The scheduler and controller inside gradhub-api. Each pass:
//   1. nodes: one that missed its lease becomes LOST and its ranks' attempts fail
//      (INFRASTRUCTURE, "nodes/x lost: no heartbeat for N s"); a DRAINING node's jobs are
//      restarted elsewhere, and it becomes CORDONED once empty;
//   2. attempts in flight: decides what the ranks' reported states mean (every rank started:
//      RUNNING; all exited 0: SUCCEEDED; one failed or no progress for hang_timeout: the
//      attempt fails and the job restarts or fails, see attempts.h);
//   3. cancellations: a CANCELLING job none of whose ranks is live any more becomes CANCELLED;
//   4. the queue: places each PENDING or RESTARTING job, all of its ranks at once or none
//      (gang placement), and otherwise writes why it waits into its state_reason. While no
//      node can take a rank and nothing changed, only the jobs submitted since the last pass
//      are judged (the light pass; QueueNeedsFullPass says when the whole queue is). In this
//      order (FairShareOrder): priority first; then, at one priority, the tenant holding the
//      fewest slots next, each tenant's jobs in submission order; per job (QueuePass):
//        a. a job whose last attempt still has live ranks waits for them;
//        b. a job no registered node could ever run waits aside, saying what no node offers;
//           it holds nothing, and the next pass judges it again against the nodes then;
//        c. once the queue is closed (d), the job waits for the slots kept for the job that
//           closed it (named only to that job's own tenant);
//        d. the job is placed if its gang fits now; if not, and it has waited backfill_window
//           and the ready nodes could hold it once idle, it closes the queue behind it.
//
// The control plane may restart under running jobs. The protocol that keeps them running
// (the agent's side is in gpu_worker/agent/agent.h and reconcile.h):
//   1. While gradhub-api is away, agents keep their ranks running for their
//      --api-outage-grace (defaults::kApiOutageGrace), retrying Heartbeat; the ranks need the api
//      only to rendezvous, which a running attempt has done.
//   2. A starting api does not declare a node LOST for startup_grace (at least one lease)
//      unless the node has heartbeated to it since it started: a node's last heartbeat from
//      before is old only because no api was there to take it.
//   3. The agent's next Heartbeat, with the session it already had (the session lives in
//      PostgreSQL, not in the api process), reports what runs; the api records it and answers
//      with the same desired set, so the ranks are adopted as they are: nothing restarts.
//   4. A node still silent once startup_grace is over, or silent for a lease while the api is
//      up, is LOST (step 1 of the pass): its attempts fail as INFRASTRUCTURE naming the
//      silence; its agent, when it comes back, gets FAILED_PRECONDITION, stops its ranks and
//      registers again. Except while its attempts' ranks on heartbeating nodes still run: a
//      partition between the node and the api alone then costs nothing up to
//      node_outage_grace (SilentNodeIsLost, scheduling_rules.h).
//   5. An outage longer than the agents' grace: each agent has stopped its ranks on its own
//      and reports them STOPPED "... no successful heartbeat for ..." when it reconnects; the
//      attempt fails (INFRASTRUCTURE) with that reason and the job restarts per its budget.
//   6. The same holds when the api stays up but its database is out of reach: heartbeats fail
//      (UNAVAILABLE, which agents retry as in step 1) and no state changes. The sweep counts a
//      node's silence only from the end of the outage (db::Pool::last_unreachable) and gives it
//      startup_grace from there, as in step 2; the hang watchdog counts no silence from before
//      it either (JudgeAttempt step 4). Running jobs are not restarted for the outage.
//
// Leadership: every api replica runs a Scheduler, but only the leader's passes run
// (leader_lease.h). Every step that writes is its own transaction, fenced by the leader's term
// and under one PostgreSQL advisory lock: a deposed leader's step fails its fence instead of
// writing, and a pass interrupted by a crash or a takeover is simply redone by the next leader.
// The fence's row lock makes a transaction a durable commit (a WAL flush), so steps 1 and 2
// first look without locks and fence only what they will write. A new
// term counts silence (protocol steps 2 and 6) only from its own start, as a starting api
// does: before it, the previous leader or this replica before a pause may have recorded
// nothing.
//
// Backfill: a job behind a blocked one may be placed around it only while the blocked job
// has waited less than backfill_window; after that nothing behind it starts, so the free
// slots accumulate for it. The blocked job therefore waits at most backfill_window plus the
// run time of the jobs that backfilled during that window. No job starves another tenant's:
// an infeasible job never closes the queue (4b), and a tenant that floods the queue is served
// a job at a time like every other, behind any tenant holding fewer slots (4, FairShareOrder).
//
// The rules themselves (placement, backfill, the verdict on an attempt, restart budgets,
// drains) are pure functions in scheduling_rules.h, each tested without a database; this
// class reads their snapshots and writes their decisions.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gradhub/v1/jobs.pb.h"
#include "services/api/leader_lease.h"
#include "services/api/scheduling_rules.h"
#include "services/common/contract/defaults.h"
#include "services/common/db/pool.h"

namespace gradhub::api {

// The spec of each waiting job (whole, with its defaults, as a placement under the lock reads
// it), kept across the scheduler's passes: a spec never changes, and parsing each waiting
// job's from JSON on every pass was a third of the api's CPU with 10,000 jobs queued.
// Thread-compatible: one pass at a time uses it.
class QueuedSpecs {
 public:
  struct Entry {
    bool loaded = false;
    v1::JobSpec spec;
    // PlacementShape(spec): jobs of one shape fit a snapshot of the nodes or not together.
    std::string shape;
    std::string tenant;  // tenants/NAME of the job: which tenant_data_roots it may use
    uint64_t seen_in_pass = 0;
  };

  // The entry of each job in `queue` (rows with a `name`), in its order, nullptr where its
  // spec cannot be read; reads those not cached yet and forgets the jobs no longer in it.
  // The pointers stay valid until the next call.
  absl::StatusOr<std::vector<const Entry*>> Read(db::Pool& pool, const db::Result& queue);
  // The same for some of the waiting jobs (the light pass), forgetting none.
  absl::StatusOr<std::vector<const Entry*>> Add(db::Pool& pool, const db::Result& jobs);
  // The spec (with defaults) and tenant of a job just submitted through this replica, so that no
  // pass reads it back from the database. Thread-safe, unlike the rest: request threads call it.
  void Offer(const std::string& name, const v1::JobSpec& spec, const std::string& tenant);
  // Drops the offers: a replica that does not lead runs no pass to take them.
  void DropOffers();

 private:
  // Reads the stored specs of `ids` (job ids) into their entries.
  absl::Status Load(db::Pool& pool, const std::vector<std::string>& ids);

  uint64_t passes_ = 0;
  std::mutex offers_mu_;
  std::unordered_map<std::string, Entry> offers_;  // guarded by offers_mu_; Add takes them
  // Job name -> entry, for the jobs waiting at the last pass. Pointers to the values stay
  // valid while their jobs wait (an unordered_map does not move its nodes).
  std::unordered_map<std::string, Entry> entries_;
};

struct SchedulerOptions {
  absl::Duration interval = absl::Milliseconds(200);
  // A node without a heartbeat for this long is LOST (kLeaseHeartbeats heartbeat intervals).
  absl::Duration node_lease =
      absl::FromChrono(defaults::kHeartbeatInterval) * defaults::kLeaseHeartbeats;
  // After the scheduler is constructed (the api starts), and after a database outage ends, no
  // node is declared LOST for this long (protocol steps 2 and 6). At least node_lease; main gives
  // 10 heartbeat intervals: agents usually get through 1-2 s after the api is back, but one of ~10
  // runs of the e2e test saw an agent's gRPC channel take over 6 s to reconnect on a loaded
  // machine.
  absl::Duration startup_grace = absl::Seconds(3);
  // A silent node whose attempts' ranks on other nodes still run is LOST only after this long
  // (SilentNodeIsLost): the agents' --api-outage-grace, after which they stop their ranks.
  absl::Duration node_outage_grace = absl::FromChrono(defaults::kApiOutageGrace);
  absl::Duration backfill_window = absl::Seconds(60);
  // While no node can take a rank and nothing changed, the whole queue is gone over again only
  // this long after the last time (QueueNeedsFullPass rule 4).
  absl::Duration queue_refresh = absl::Seconds(30);
  // A rank that exits because it lost its peers is usually not the culprit: the rank that
  // died is. Its report may come a heartbeat later from another node, so the verdict waits
  // this long for it before blaming the infrastructure.
  absl::Duration peer_failure_grace = absl::Seconds(3);
  // Called once a pass has committed a job's move to RUNNING, with the time since the job
  // entered the queue (submitted, or restarting): its scheduling latency. Empty = not reported.
  std::function<void(absl::Duration)> on_running;
  // The replica's lease: passes run only while it holds a term, and each transaction is
  // fenced by it. nullptr: this scheduler is the only one and always acts (tests).
  LeaderLease* leader = nullptr;
  // Called right after a transaction that changed some node's desired set committed (a
  // placement; ranks told to stop by a failure, a cancellation, a drain or a lost node): the
  // agents' WatchAssignments streams (AssignmentNotifier). Empty = agents learn on heartbeats.
  std::function<void()> on_assignments_changed;
};

// Thread-safety: Start, Stop and the destructor from the owning thread; Nudge and JobCreated
// from any thread at any time (request threads call them). RunOnce from one thread at a time
// besides the loop (pass_mu_ serializes passes); concurrent api replicas are serialized by the
// advisory lock each pass takes in PostgreSQL.
class Scheduler {
 public:
  Scheduler(db::Pool* pool, SchedulerOptions options) : pool_(pool), options_(options) {}
  ~Scheduler() { Stop(); }

  // One pass; for tests, and what the loop runs.
  absl::Status RunOnce();

  // Runs passes every interval (sooner after Nudge, but never closer than nine times the last
  // pass took) on a thread of its own until Stop.
  void Start();
  void Stop();
  // Something changed (a rank exited, a node came or went, a job was cancelled): run the next
  // pass now.
  void Nudge();
  // A job was created: placed on the fast path at once if it can be (see Start), else by the
  // next pass, which runs now.
  void JobCreated(const std::string& name);
  // JobCreated for a job submitted through this replica, with its spec (with defaults), which
  // the passes then need not read back.
  void JobSubmitted(const v1::Job& job, const v1::JobSpec& spec);
  // The reason a job of `spec` (with defaults) and of `tenant` (tenants/NAME), submitted now, waits
  // with: the light pass's verdict on it, against the last pass's look at the nodes. CreateJob
  // stores it with the job, so that while the cluster is full no pass writes a reason per new
  // job (an UPDATE of each new row). Empty when this replica does not lead, when its last pass
  // found a node free (the next pass places or judges the job): the light pass then judges the
  // job, as it does one created on another replica. Thread-safe.
  std::string ReasonForNewJob(const v1::JobSpec& spec, const std::string& tenant);

 private:
  // Pass step 1 in one transaction: lost nodes, then drains (PlanDrains); none when no node is
  // silent or draining.
  absl::Status SweepNodes();
  absl::Status DeclareLostNodes(db::Transaction& tx);
  absl::Status ApplyDrains(db::Transaction& tx);
  // Step 2: each attempt in flight, in a transaction of its own (JudgeAttempt). Returns the
  // time the job waited in the queue when this made it RUNNING.
  absl::Status ReconcileAttempts();
  absl::StatusOr<std::optional<double>> ReconcileAttempt(const std::string& name, int32_t attempt);
  // What an attempt in flight needs, as read in `tx` (the job FOR UPDATE when `lock`).
  struct AttemptReview {
    v1::Job job;
    bool end_with_job = false;  // the job ended (cancelled) or moved on, the attempt in flight
    std::optional<AttemptVerdict> verdict;  // else JudgeAttempt's, while the attempt is in flight
    bool NeedsWrite() const { return end_with_job || (verdict && verdict->ChangesSomething()); }
  };
  absl::StatusOr<AttemptReview> ReviewAttempt(db::Transaction& tx, const std::string& name,
                                              int32_t attempt, bool lock);
  // Step 3.
  absl::Status FinishCancellations();
  // Step 4: the whole queue (PlaceJobs) or the light pass (JudgeNewJobs), as QueueNeedsFullPass
  // decides from the nodes read for it.
  absl::Status ServeQueue();
  // The whole queue in FairShareOrder against `snapshot` of the nodes (QueuePass::Next), each
  // placement confirmed and written under the lock (PlaceJob).
  absl::Status PlaceJobs(std::vector<NodeRecord> snapshot);
  // What the last full pass of the queue found, for the fast path, which trusts it only in
  // the same term (another leader may have acted in between), and for the light pass.
  struct QueueVerdict {
    int64_t term = -1;  // -1: no full pass yet
    absl::Time full_pass_began = absl::InfinitePast();
    // The job that closed the queue (past its backfill window, unplaced), by its place in the
    // queue, and its tenant: the fast path places no new job behind it.
    std::optional<QueuePosition> blocking;
    std::string blocking_tenant;
    // Whether some node could take a rank when the pass read the nodes (AnyNodeTakesARank).
    // The light pass's too.
    bool some_node_free = true;
  };

  // How a job submitted since the last full pass is judged while no node takes a rank: by that
  // pass's verdict on the queue (FastPathMayPlace's "behind" the job that closed it) and the
  // nodes read since. Thread-safe: the light pass and ReasonForNewJob use it at once.
  class NewJobJudge {
   public:
    NewJobJudge(std::vector<NodeRecord> nodes, const QueueVerdict& verdict,
                absl::Duration backfill_window);
    // Its reason (QueuePass::JudgeSubmitted), or "" should it fit after all.
    std::string Reason(const QueuedJob& job, int32_t priority);

   private:
    const std::optional<QueuePosition> blocking_;
    std::mutex mu_;     // guards the passes, whose verdicts per key are cached
    QueuePass open_;    // for a job ahead of blocking_, or with none
    QueuePass closed_;  // for a job behind it
  };
  // The light pass: the jobs `names` (submitted since the last pass) that were stored without a
  // reason get the one `judge` gives them.
  absl::Status JudgeNewJobs(const std::vector<std::string>& names, NewJobJudge& judge);
  // JobCreated; the light pass judges the job unless it was stored with its reason (`judged`).
  void TellNewJob(const std::string& name, bool judged);
  // Makes `judge` ReasonForNewJob's (nullptr: none).
  void PublishJudge(std::shared_ptr<NewJobJudge> judge);
  // Whether the job was placed (QueuePass::Confirm, then the attempt written).
  absl::StatusOr<bool> PlaceJob(QueuedJob job, QueuePass& pass);
  // PlaceJob, then wakes the agents; a placement counts for its tenant in `order` (if any).
  void PlaceAndTell(QueuedJob job, QueuePass& pass, FairShareOrder* order);
  // The fast path (Start): jobs created since the last pass, placed in queue order without
  // reading the queue, when the last pass's verdict on every job ahead of them still holds.
  absl::Status PlaceNewJobs(const std::vector<std::string>& names);
  // Remembers the job that closed the queue in this pass, for the fast path.
  void NoteBlockingJob(const db::Result& queue, const QueuePass& pass);
  // Between passes: waits until `until` (or Stop, or when `nudgeable` a Nudge), running the
  // fast path for new jobs meanwhile. `lock` holds mu_.
  void WaitPlacingNewJobs(std::unique_lock<std::mutex>& lock,
                          std::chrono::steady_clock::time_point until, bool nudgeable);
  // Sets each job's state_reason (reason -> job ids) where the job still waits.
  absl::Status SetPendingReasons(const std::map<std::string, std::vector<std::string>>& reasons);

  // Under pass_mu_: the term this pass or fast path acts in (term_), or false when this
  // replica does not lead now.
  bool TakeTerm();
  // First in every transaction of a pass: the leader's fence, then the advisory lock.
  absl::Status LockAsLeader(db::Transaction& tx);
  // Since when silence counts (HeartbeatsRecordableSince): the term's start, the end of the
  // last database outage.
  absl::Time RecordableSince() const;

  // Set inside a transaction that changes a desired set; AssignmentsChanged() reports it once
  // the transaction has committed (an agent that heard earlier would read the old set).
  void MarkAssignmentsChanged() { assignments_changed_ = true; }
  void AssignmentsChanged();

  db::Pool* pool_;
  const SchedulerOptions options_;
  std::atomic<bool> assignments_changed_{false};
  // Without a leader lease, startup_grace counts from here: construction, then Start() (once
  // the api serves). Set before the loop's thread exists; read only by passes.
  absl::Time start_time_ = absl::Now();
  std::mutex mu_;
  std::condition_variable wake_;
  // Atomic as well as guarded: a pass over a long queue reads it without the lock, to end early.
  std::atomic<bool> stopping_{false};
  // What Nudge and JobCreated tell the loop, guarded by mu_.
  struct Told {
    bool nudged = false;
    std::vector<std::string> new_jobs;  // created since the last pass began, for the fast path
    std::vector<std::string> unjudged;  // created since the last pass took them, for the light one
    // A Nudge since the last pass began: capacity may have been freed (or the queue changed
    // otherwise), so the last pass's verdicts may not hold and the fast path waits for a pass.
    bool capacity_changed = true;
    // A Nudge since the last full pass began (QueueWatch::changed).
    bool queue_changed = true;
  } told_;
  std::thread loop_;
  std::mutex pass_mu_;  // one pass at a time (the loop's, a test's); guards what follows
  QueuedSpecs queued_specs_;
  LeaderTerm term_;  // the term of the pass in progress, or of the last one
  QueueVerdict verdict_;
  // verdict_.some_node_free of the last pass, for JobCreated, which does not take pass_mu_.
  std::atomic<bool> node_was_free_{true};
  // For ReasonForNewJob: the last pass's judge, while it left no node free in this term.
  struct PublishedJudge {
    std::mutex mu;
    std::shared_ptr<NewJobJudge> judge;  // guarded by mu
  } published_judge_;
};

}  // namespace gradhub::api
