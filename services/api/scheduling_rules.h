// The control plane's decisions as pure functions: each takes a snapshot of what PostgreSQL
// holds (nodes, the queue, an attempt's ranks, a node's live ranks) and returns what to do.
// None of them touches the database or the clock, so each rule has a test of its own
// (tests/unit/api/scheduling_rules_test.cc); Scheduler and NodeManager read the snapshot and
// apply the actions in a transaction under the scheduler's advisory lock.
//
// Thread-compatible: plain functions of their arguments; QueuePass is one pass's state.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "absl/time/time.h"
#include "gradhub/v1/jobs.pb.h"
#include "gradhub/v1/nodes.pb.h"

namespace gradhub::api {

// ---------------------------------------------------------------------------------------------
// Placement

// A directory of a node that only one tenant's jobs may name (Node.tenant_data_roots).
struct TenantRoot {
  std::string tenant;  // tenants/NAME
  std::string path;
};

// A node as placement sees it, before any job's needs are applied.
struct NodeRecord {
  int64_t id = 0;
  std::string name;
  v1::Node::State state = v1::Node::READY;  // only READY nodes take new ranks
  bool heartbeating = false;                // within its lease
  v1::Node::DeviceKind kind = v1::Node::CPU;
  std::map<std::string, std::string> labels;
  std::vector<std::string> data_roots;        // every tenant's jobs may name files under these
  std::vector<TenantRoot> tenant_data_roots;  // only the named tenant's jobs may
  int64_t memory_per_slot_bytes = 0;          // a rank's memory limit there; 0 = no limit
  int32_t slots = 0;                          // in all, used or not
  std::vector<int32_t> free_slots;            // ascending; on CUDA nodes a slot is a GPU
  int32_t master_port_base = 0;  // script jobs' MASTER_PORT base; 0 = runs no script jobs
};

// The data roots a job of `tenant` (tenants/NAME) may name files under on a node: its shared
// data_roots and the tenant_data_roots entries of that tenant, never another tenant's.
std::vector<std::string> RootsOfTenant(const NodeRecord& node, std::string_view tenant);

struct RankPlacement {
  int32_t rank = 0;
  int32_t local_rank = 0;
  int32_t slot = 0;
  int64_t node_id = 0;
  std::string node;  // name
};

// Where a gang goes, or why it waits.
struct GangPlacement {
  std::vector<RankPlacement> ranks;  // every rank of the job, in rank order; empty = it waits
  v1::Node::DeviceKind kind = v1::Node::CPU;  // of every node it is on; decides backend AUTO
  int32_t pipeline_stages = 1;                // of the job: a replica is this many ranks
  std::string why;                            // set when it waits
  // Pairs of nodes kept apart (PlaceGangAvoiding), named in the placement's event.
  std::vector<std::pair<std::string, std::string>> avoided;
  bool placed() const { return !ranks.empty(); }
};

// The device kinds a job may run on, preferred first (one kind for the whole gang: NCCL and
// Gloo do not mix), from contract/job_spec.h's statement of them: NCCL or FP16 need CUDA nodes
// (NeedsCuda); GLOO runs on CPU nodes (TrainsOnCpu: a GPU slot would sit idle under it); AUTO
// runs on either, and becomes NCCL on CUDA nodes and GLOO on CPU nodes, except in an
// interleaved pipeline, which runs on Gloo only (RunsOnGlooOnly): CPU nodes.
std::vector<v1::Node::DeviceKind> DeviceKindsFor(const v1::JobSpec& spec);

// A job as the node filters see it: its spec (defaults applied), its tenant (tenants/NAME:
// whose tenant_data_roots it may use; empty = none) and the device kinds it runs on. Holds
// references to the spec and the tenant.
struct JobNeeds {
  explicit JobNeeds(const v1::JobSpec& spec, std::string_view tenant = {})
      : spec(spec), tenant(tenant), kinds(DeviceKindsFor(spec)) {}
  const v1::JobSpec& spec;
  std::string_view tenant;
  std::vector<v1::Node::DeviceKind> kinds;
};

// A scheduling filter, as Kubernetes' filter plugins: whether one node may take ranks of a job,
// and a reason of its own, the one the job waits with when no node passes it together with
// every filter before it. Both pure functions. A capability filter asks what the node is
// (labels, roots, kind, memory), which only a registration changes; the others ask what it
// offers now (its state, its free slots).
struct NodeFilter {
  const char* name;
  bool (*admits)(const NodeRecord& node, const JobNeeds& job);
  std::string (*why_none)(const JobNeeds& job);
  bool capability;
};

// The filters, in the order their reasons are given (the most specific first):
//   NodeSelector  the node's labels hold every key=value of spec.nodeSelector;
//   DataRoots     its data roots the job's tenant may use (RootsOfTenant) hold every file the
//                 spec names (contract/data_paths.h);
//   DeviceKind    it is of a kind the job runs on (DeviceKindsFor);
//   RunsScripts   a script job's node has a master port base (gradhub-agent --master-port-base);
//   Memory        spec.memoryPerRankMib (0 = any) fits its memory_per_slot_bytes (0 = no limit);
//   Ready         READY (not cordoned or draining) and heartbeating within its lease;
//   FreeSlot      it has a free slot.
// All but the last two are capability filters. The last two share their reason: "needs N
// slots, no ready node has a free slot".
const std::vector<NodeFilter>& NodeFilters();

// The nodes every filter admits (only the capability filters when `capability_only`), in the
// order of `nodes`; when none, `why` is the reason of the first filter that no node passes with
// every filter before it ("no node is registered" when `nodes` is empty).
struct Admission {
  std::vector<const NodeRecord*> nodes;
  std::string why;
};
Admission AdmitNodes(const JobNeeds& job, const std::vector<NodeRecord>& nodes,
                     bool capability_only = false);

// Whether a job could ever run on the registered nodes, whatever runs there now:
//   1. Capable nodes: those every capability filter admits, in any state (a cordoned node may
//      be uncordoned, a silent one may come back). None: `never` is the reason of the filter
//      that stopped them ("no node is registered" when there is none).
//   2. Of one device kind, their slots in all (at most ranks_per_node of each) hold the world
//      size. Otherwise `never` = "needs N slots (at most K per node); the registered nodes
//      that could run it have M in all".
//   3. `fits_when_idle`: so do the slots of the capable nodes that are READY and heartbeating,
//      used or not. Only such a job is worth keeping freed slots for (QueuePass step 4): one
//      that needs a cordoned or silent node would hold the queue for nothing.
// A job with `never` set waits aside (QueuePass step 2); each pass judges it again against the
// nodes registered then, so a node that registers or changes is seen at once.
struct Feasibility {
  std::string never;  // empty = some registered nodes could hold the job
  bool fits_when_idle = false;
};
Feasibility JudgeFeasibility(const JobNeeds& job, const std::vector<NodeRecord>& nodes);

// Gang placement of one job (its spec with defaults applied, of `tenant`) on `nodes`:
//   1. Eligible nodes: those every filter admits (AdmitNodes).
//   2. Of one device kind at a time (DeviceKindsFor's order of preference), pack the ranks onto
//      as few nodes as possible: the nodes with the most free slots first (rank 0 on the first),
//      at most ranks_per_node on each, lowest free slots first, each node's ranks in rank order.
//   3. A pipeline of S stages (parallelism.pipelineStages, job_spec.h ParallelismOf) places
//      whole replicas (S consecutive ranks, rank = replica * S + stage) first, so that a
//      stage's neighbours share its node and their activations never cross the network:
//        a. in step 2's node order, each node takes as many whole replicas as its usable slots
//           hold, replicas in rank order;
//        b. only the replicas left then (when no placement of these slots keeps them all
//           whole) are split, over the slots left, in the same node order.
//      Without a pipeline (S = 1) a replica is a rank, and steps a and b are step 2.
//   4. All ranks placed, or none: then `why` names what is missing, most specific first: the
//      reason of the filter no node passed, else the count of usable slots.
GangPlacement PlaceGang(const v1::JobSpec& spec, const std::vector<NodeRecord>& nodes,
                        std::string_view tenant = {});

// Two nodes (nodes/NAME each) whose ranks could not reach each other in a job's last attempt
// (contract/unreachable_nodes.h, read from that attempt's failure).
using NodePair = std::pair<std::string, std::string>;

// PlaceGang, kept off broken links while other capacity exists: the job's next attempt uses
// both nodes of a pair in `avoid` only when no placement without that fits.
//   1. No pairs: PlaceGang.
//   2. For each way of leaving out one node of every pair (the second of each first, then the
//      first; the first 4 pairs only: 16 ways), PlaceGang on the other nodes; the first that
//      places wins, and its `avoided` lists the pairs.
//   3. Otherwise PlaceGang on every node: a link that failed once may work again, and waiting
//      for capacity that is not there would hold the job for nothing.
// Places exactly when PlaceGang would (the same `why` when not), so a pass's verdicts per
// spec shape hold for jobs with pairs as well.
GangPlacement PlaceGangAvoiding(const v1::JobSpec& spec, const std::vector<NodeRecord>& nodes,
                                std::string_view tenant, const std::vector<NodePair>& avoid);

// The placement-relevant part of a spec as text (QueuedJob::shape): its deterministic wire
// bytes, less the fields placement never reads (names, labels, the optimizer and schedule,
// the loop's lengths, checkpoints, restarts, priority, seed, the collective timeout,
// parallelism but its stages). A list of what it drops rather than of what it keeps, so that
// a rule reading one more field cannot be forgotten here: a field left in only makes fewer
// jobs share a shape.
std::string PlacementShape(const v1::JobSpec& spec);

// A job in the queue as one pass of the scheduler sees it.
struct QueuedJob {
  std::string name;                   // jobs/ID
  std::string tenant;                 // tenants/NAME
  int32_t attempt = 0;                // its current (last) attempt; the next is attempt + 1
  const v1::JobSpec* spec = nullptr;  // with defaults applied
  // The placement-relevant part of the spec as text: jobs of one shape (and tenant) fit a
  // snapshot of the nodes or not together. Empty = not known (never shared with another job).
  std::string_view shape;
  bool stopping = false;  // RESTARTING with ranks of its last attempt still live
  absl::Duration waited;  // since it entered the queue (submitted, or restarting)
  // Nodes whose ranks could not reach each other in its last attempt (PlaceGangAvoiding).
  std::vector<std::pair<std::string, std::string>> unreachable_pairs;
};

// One pass over the queue, in FairShareOrder. For each job:
//   1. a job whose last attempt's ranks are still live waits for them: its next attempt would
//      otherwise share their slots and their rendezvous;
//   2. a job no registered node could ever run (JudgeFeasibility) waits aside with what no
//      node offers, and holds nothing: no slots are kept for it, no job waits behind it;
//   3. once a job that does not fit has waited backfill_window, no job behind it is placed
//      (backfill is over): the slots that free up accumulate for it. Those behind it are told
//      they wait for slots, and the job's name only when it is their own tenant's;
//   4. otherwise the job is placed if its gang fits (PlaceGangAvoiding, kept off the links its
//      last attempt could not use while it can be); a job that does not fit waits
//      with PlaceGang's reason and, past its window, closes the queue behind it (step 3) if the
//      ready nodes could hold it once their running jobs end (Feasibility::fits_when_idle).
// Next decides against the pass's snapshot of the nodes and takes the slots of what it
// places from it, so later jobs of the pass see them taken. Confirm decides again against
// nodes read under the scheduler's lock, before the placement is written.
class QueuePass {
 public:
  QueuePass(std::vector<NodeRecord> snapshot, absl::Duration backfill_window)
      : snapshot_(std::move(snapshot)), backfill_window_(backfill_window) {}

  GangPlacement Next(const QueuedJob& job);
  // Next's verdict on a job being submitted, before it is in the queue (it has no name yet):
  // it has waited for nothing, so it closes the queue for no job, and it takes no slots.
  GangPlacement JudgeSubmitted(const QueuedJob& job);
  GangPlacement Confirm(const QueuedJob& job, const std::vector<NodeRecord>& nodes);
  // The job that closed the queue (step 3), once one has, and its tenant.
  const std::optional<std::string>& blocked_by() const { return blocked_by_; }
  const std::string& blocked_tenant() const { return blocked_tenant_; }
  // Step 3 as an earlier pass left it: the queue is closed behind `job` of `tenant`. For judging
  // jobs that come after that job without going over the queue again (the light pass).
  void CloseBehind(std::string job, std::string tenant);

 private:
  // What a job of one tenant and shape met in this pass: a snapshot keeps its nodes and only
  // loses free slots, so a later job of the same key fares the same, and a long queue is
  // mostly a few keys.
  struct KeyVerdict {
    Feasibility feasibility;
    std::optional<std::string> unfit;  // PlaceGang's reason, once a job of the key did not fit
  };
  // Step 3's reason, once the queue is closed.
  std::optional<std::string> Closed(const QueuedJob& job) const;
  // Steps 2-4 against `nodes`, with the job's feasibility judged already; `unfit` caches step
  // 4's reason for the job's key.
  GangPlacement Decide(const QueuedJob& job, const Feasibility& feasibility,
                       const std::vector<NodeRecord>& nodes, std::optional<std::string>* unfit,
                       bool may_close = true);
  // Next, or JudgeSubmitted when `queued` is false.
  GangPlacement Judge(const QueuedJob& job, bool queued);
  void TakeSlots(const GangPlacement& placement);

  std::vector<NodeRecord> snapshot_;
  const absl::Duration backfill_window_;
  std::optional<std::string> blocked_by_;  // the first job past its window that did not fit
  std::string blocked_tenant_;             // its tenant
  std::unordered_map<std::string, KeyVerdict> verdicts_;  // tenant NUL shape -> verdict
};

// A job's place in the queue: priority (highest first), then submission time, then name.
struct QueuePosition {
  int32_t priority = 0;
  int64_t create_us = 0;  // submission time, microseconds since the epoch
  std::string name;
  bool Before(const QueuePosition& other) const;
};

// One waiting job as FairShareOrder sees it.
struct FairShareEntry {
  QueuePosition position;
  std::string tenant;  // any text naming the tenant
  int32_t slots = 0;   // its world size: what its tenant holds once it is placed
};

// The order a pass serves the queue in, so that no tenant's jobs starve another's:
//   1. priority first: no job is served before one of a higher priority;
//   2. among the tenants with jobs at that priority, the one holding the fewest slots goes
//      next (its live ranks when the pass began, plus what the pass placed for it since),
//      ties to the tenant whose next job was submitted first;
//   3. each tenant's jobs in submission order (QueuePosition): its head job first.
// A tenant flooding the queue gets a turn like any other, not one per job it submitted: as
// soon as it holds more slots than another tenant with a job waiting, that job comes first.
// Thread-compatible; one pass's state. Next is O(log tenants).
class FairShareOrder {
 public:
  // `held`: slots of live ranks per tenant when the pass began (absent = none).
  FairShareOrder(std::vector<FairShareEntry> jobs, const std::map<std::string, int64_t>& held);
  FairShareOrder(const FairShareOrder&) = delete;  // its turns point into its jobs
  FairShareOrder& operator=(const FairShareOrder&) = delete;

  // The index in `jobs` of the next job to serve; nullopt once every job was served.
  std::optional<size_t> Next();
  // The job Next returned last was placed: its slots count for its tenant from now on.
  void Placed();

 private:
  struct Tenant {
    int64_t held = 0;
    std::vector<size_t> jobs;  // at the current priority, in QueuePosition order
    size_t next = 0;           // in jobs
  };
  // A tenant's claim to go next at the current priority (step 2).
  struct Turn {
    int64_t held;
    const QueuePosition* head;
    size_t tenant;
    bool operator<(const Turn& other) const;
  };
  void Enqueue(size_t tenant);  // its turn, if it has a job left at this priority
  bool StartNextPriority();     // false when no priority is left
  std::vector<FairShareEntry> jobs_;
  std::vector<size_t> tenant_of_;    // job index -> index in tenants_
  std::vector<size_t> by_priority_;  // job indices by priority (highest first), then position
  size_t next_level_ = 0;            // in by_priority_: the first job of the next priority
  std::vector<Tenant> tenants_;
  std::set<Turn> turns_;
  std::optional<size_t> last_;  // the job Next returned last
};

// The scheduler's fast path (scheduler.h): a job created since the last pass may be placed
// before the next one only while that pass's verdict on every job ahead of it still holds:
//   1. no capacity was freed since (a rank exited, a node came, a job was cancelled): the jobs
//      ahead that did not fit then still do not fit, so the new job only backfills;
//   2. no job closed the queue in that pass (QueuePass step 3), or the new job's priority is
//      higher than that job's: of equal priority, FairShareOrder may well serve it later.
bool FastPathMayPlace(const QueuePosition& job, const std::optional<QueuePosition>& blocking,
                      bool capacity_changed);

// Whether some node of `nodes` could take a rank now: READY, heartbeating, with a free slot
// (PlaceGang's first filters). When none can, no gang fits whatever its spec, so the fast path
// need not try its new jobs one transaction each: the next pass says why they wait.
bool AnyNodeTakesARank(const std::vector<NodeRecord>& nodes);

// What a pass knows of the queue when it comes to it (pass step 4, scheduler.h).
struct QueueWatch {
  bool full_pass_in_term = false;  // a pass of this leader's term has gone over the whole queue
  bool changed = true;             // a Nudge since that pass began (a rank exited, a node came...)
  bool some_node_free = true;      // AnyNodeTakesARank on the nodes this pass read
  absl::Duration since_full_pass;  // since that pass began
};

// Whether a pass goes over the whole queue, or judges only the jobs submitted since the last
// pass (the light pass). A full pass reads every waiting job, so it is long when the queue is,
// and the queue grows long when the cluster is full, which is exactly when a full pass can
// place nothing: with 18,000 jobs waiting, its reads put CreateJob's p99 from 7 to 18 ms on a
// 2-core host (tests/bench/create_jobs). Kubernetes' scheduler keeps such pods aside the same
// way (its "unschedulable" queue) until a cluster event or a timeout moves them back.
// A full pass:
//   1. when no pass of this term has gone over the queue: what this replica knows of the queue
//      is of another term, and another leader may have acted since;
//   2. after a change (`changed`): capacity may have been freed, or the nodes a job could ever
//      run on may differ;
//   3. when some node could take a rank: a job may be placed;
//   4. when the last one began `refresh` ago: the reasons that turn with time (a job past its
//      backfill window closing the queue) are written again, and a job whose creation signal
//      was lost (replica_signals.h) gets its reason;
//   5. otherwise the light pass: no gang fits on nodes none of which takes a rank, so a full pass
//      would place nothing and write again the reasons it wrote last time. The jobs submitted
//      since get theirs from the light pass.
bool QueueNeedsFullPass(const QueueWatch& watch, absl::Duration refresh);

// The event text of a placement: "attempt 3 placed on nodes/a (ranks 0-1), nodes/b (rank 2)",
// with ", CUDA" when on GPU nodes. A pipeline's names its layout, replica by replica:
// "attempt 3 placed 2 stages x 2 replicas: replica 0 on nodes/a (ranks 0-1), replica 1 on
// nodes/a (rank 2) and nodes/b (rank 3)". Every node appears as "nodes/NAME (rank R)" or
// "nodes/NAME (ranks R-S)", which `gradhub describe` reads back (cli/output.h PipelineLayout).
std::string PlacementMessage(int32_t attempt, const GangPlacement& placement);

// ---------------------------------------------------------------------------------------------
// Attempts in flight

// One rank of an attempt as its agent last reported it.
struct RankReport {
  int32_t rank = 0;
  std::string state;  // rank_assignments.state: ASSIGNED STARTING RUNNING STOPPING SUCCEEDED ...
  std::string node;   // name
  std::string message;
  int32_t exit_code = 0;
  int32_t signal = 0;
  double seconds_in_state = 0;  // since its state last changed
};

struct AttemptSnapshot {
  v1::Job::State job_state = v1::Job::STATE_UNSPECIFIED;
  int32_t hang_timeout_seconds = 0;  // the spec's, with its default applied
  // In the order their state last changed, then by rank: the first failure reported first.
  std::vector<RankReport> ranks;
  double seconds_since_start = 0;  // since the attempt was created or, once RUNNING, started
  std::optional<double> seconds_since_step;  // since the newest step of any rank
  bool script = false;                       // a script job (JobSpec.script): its exits differ
  // Since the ranks' reports could be recorded (HeartbeatsRecordableSince: the api's start, the
  // end of a database outage); unset = always. Steps not heard before then are not a hang.
  std::optional<double> seconds_since_recordable;
};

// How an attempt ended badly, whatever noticed it (a rank's exit, the hang watchdog, a lost or
// drained node, an agent that restarted): the event, the failure kind (the budget it spends,
// see DecideRestart) and what the history keeps.
struct AttemptFailure {
  v1::JobEvent::Type event = v1::JobEvent::RANK_FAILED;  // or NODE_LOST, HANG_DETECTED
  v1::JobEvent::FailureKind kind = v1::JobEvent::JOB;
  int32_t rank = -1;  // -1 = not about one rank
  std::string node;   // nodes/NAME, or empty
  int32_t exit_code = 0;
  int32_t signal = 0;
  std::string message;
};

// The kind of failure a trainer's exit means (services/common/contract/trainer_exit_codes.h): a
// user error fails the job at once; losing peers or the store is the infrastructure's fault;
// anything else (NaN, a crash, a kill) is the job's.
v1::JobEvent::FailureKind FailureKindOfExit(int exit_code, int signal);

// The same for a rank of a script job, whose exit codes are the user's program's own: a
// non-zero exit is the user's (USER: no restart), a kill by a signal the agent did not send
// the job's (JOB), and the agent's out-of-memory verdict (kExitOutOfMemory) the user's.
v1::JobEvent::FailureKind FailureKindOfScriptExit(int exit_code, int signal);

// The RANK_FAILED message of a rank that ended an attempt, cause first and the rank's own
// words apart, so that its last log line never reads as the cause:
//   stopped (by its agent, or forgotten with its node): "rank 2 was stopped by its agent: WHY";
//   failed: "rank 2 was killed by signal 9 (last log line: ...)" or
//           "rank 2 exited with code 1 (last log line: ...)"; a script's agent sends its last
//           lines: "rank 2 exited with code 3 (last log lines: A | B | C)".
// `agent_message` is what the agent reported: for a failed rank its last stderr line (or the
// exit itself, when it printed none), for a stopped one the reason it was stopped.
std::string RankFailureMessage(int32_t rank, bool stopped, int exit_code, int signal,
                               const std::string& agent_message);

struct AttemptVerdict {
  bool now_running = false;  // SCHEDULED and every rank has started: the job becomes RUNNING
  bool succeeded = false;    // RUNNING (or now_running) and every rank exited 0
  std::optional<AttemptFailure> failure;
  std::string started_reason;    // with now_running: "all 4 ranks started"
  std::string succeeded_reason;  // with succeeded: "all 4 ranks exited 0"

  // Whether the verdict changes anything (else the attempt runs on, and nothing is written).
  bool ChangesSomething() const { return now_running || succeeded || failure.has_value(); }
};

// The verdict on an attempt in flight (its job SCHEDULED or RUNNING on it):
//   1. A failed rank is blamed if its exit is not an infrastructure failure (USER or JOB:
//      a crash, a NaN, a kill); the first such report wins.
//   2. Otherwise, among infrastructure failures (a rank that lost its peers, one its agent
//      stopped) and, in a script job, non-zero exits (a script whose peer died exits 1 as it
//      would for its own bug), one its agent stopped says more, then the first reported. It is
//      blamed only once it has been reported for peer_failure_grace, or when no rank is
//      running any more: the rank that really died may be reported a heartbeat later from
//      another node (or its node found LOST), and blaming the infrastructure for a user's
//      crash, or the user for a lost node, would spend the wrong budget. The scheduler gives
//      script jobs a node lease more, so that a lost node is found first.
//   3. No failure: every rank started (STARTING, RUNNING or SUCCEEDED) makes a SCHEDULED job
//      RUNNING; every rank SUCCEEDED makes it SUCCEEDED.
//   4. The hang watchdog: no step from any rank, and no start, for hang_timeout_seconds fails
//      the attempt (HANG_DETECTED, a JOB failure), counting only time when steps could have
//      been recorded (seconds_since_recordable). A script job is watched only once one of its
//      ranks has reported a step.
AttemptVerdict JudgeAttempt(const AttemptSnapshot& attempt, absl::Duration peer_failure_grace);

// What the job becomes after a failed attempt: the failure's kind spends a budget of
// JobSpec.max_restarts (INFRASTRUCTURE its own, JOB its own; USER none: it fails at once).
struct RestartDecision {
  bool restart = false;
  // The jobs column counting what this failure spent (infra_restarts, job_restarts), or null.
  const char* counter = nullptr;
  std::string reason;  // the job's state_reason: cause, then the budget
};
RestartDecision DecideRestart(const v1::Job& job, v1::JobEvent::FailureKind kind,
                              const std::string& cause);

// Whether the live ranks of an attempt that fails with `failure` are discarded: stopped at once
// (SIGKILL) instead of with SIGTERM and the agents' grace (nodes.proto heartbeat step 4;
// FailAttempt stores the answer in job_attempts.discard_ranks):
//   1. RANK_FAILED, HANG_DETECTED: yes. One of the attempt's own ranks is gone or stuck, so the
//      survivors can finish no step (each one needs every rank) and have nothing to save that
//      the last committed checkpoint lacks; on SIGTERM they only sat in a collective, a peer
//      probe or their start-up until the grace ran out (issue 37: up to --stop-grace, 10 s),
//      and the next attempt is placed only once they are gone.
//   2. NODE_LOST (a drained node, a lost one, a restarted agent): no. A drain moves an attempt
//      whose ranks are healthy, and on SIGTERM its rank 0 commits the step it finished; a node
//      lost to a partition may still run its ranks. They keep the grace.
bool FailureDiscardsRanks(const AttemptFailure& failure);

// ---------------------------------------------------------------------------------------------
// Nodes

// A DRAINING node's live rank (or, with no job, the node without one).
struct DrainingRank {
  int64_t node_id = 0;
  std::string node;
  std::optional<std::string> job_id;
  int32_t attempt = 0;
  int32_t rank = 0;
};

struct DrainPlan {
  struct Restart {
    std::string job_id;
    int32_t attempt = 0;
    AttemptFailure failure;
  };
  std::vector<Restart> restarts;  // one per attempt running there, naming its lowest rank
  std::vector<int64_t> cordon;    // nodes with no live rank left
};

// A drain: every attempt with a rank on a DRAINING node fails as INFRASTRUCTURE (NODE_LOST,
// "nodes/x is being drained") so its job restarts elsewhere; a DRAINING node with no live rank
// left becomes CORDONED. `ranks` in node, then rank order.
DrainPlan PlanDrains(const std::vector<DrainingRank>& ranks);

// Protocol steps 2 and 6 (scheduler.h) as rules. A node's last heartbeat may be old through
// no fault of its own while no heartbeat could be recorded: before this api started, and while
// its database was out of reach (db::Pool::last_unreachable; InfinitePast() if never). Silence
// counts from the later of the two.
absl::Time HeartbeatsRecordableSince(absl::Time api_start, absl::Time database_last_unreachable);
// Whether the sweep may declare nodes LOST at `now`: only `grace` (at least a lease) after
// heartbeats became recordable, time for every agent to get one through. A node that has
// heartbeated since then needs no grace: its silence is its own (the sweep's SQL).
bool MayDeclareNodesLost(absl::Time now, absl::Time recordable_since, absl::Duration grace);

// Protocol step 4 (scheduler.h) as a rule: whether a node silent for longer than the lease is
// LOST now. A silent node is cut off from the api, or dead; the api cannot tell which, but the
// node's peers can:
//  1. Silent for the outage grace (the agents' --api-outage-grace): LOST. Its agent has
//     stopped its ranks on its own by now.
//  2. Otherwise, while it runs a rank of an attempt that also has a rank starting or running on
//     a node that is heartbeating: not yet. Those ranks are in collectives with its ranks; were
//     they dead, the peers would fail within the collective timeout and that failure, reported
//     by a live agent, ends the attempt. A partition between a node and the api alone does not
//     end a job that still trains. (Nothing new is placed on a silent node meanwhile: it is not
//     heartbeating.)
//  3. Otherwise LOST at once: nothing vouches for it.
bool SilentNodeIsLost(absl::Duration silent, absl::Duration outage_grace,
                      bool has_live_peers_elsewhere);

// The reason a lost node's attempts fail with: "nodes/a lost: no heartbeat for 7 s (lease 3s)".
std::string NodeLostReason(const std::string& node, double silent_seconds, absl::Duration lease);

// Heartbeat step 3 (nodes.proto): what the api does with one live rank row of the node.
struct LiveRank {
  std::string rank_state;          // ASSIGNED STARTING RUNNING STOPPING
  std::string job_state;           // jobs.state
  std::string attempt_state;       // job_attempts.state
  bool current_attempt = false;    // its attempt is the job's current one
  bool running_on_agent = false;   // this heartbeat reports it STARTING or RUNNING
  bool attempt_discarded = false;  // job_attempts.discard_ranks (FailureDiscardsRanks)
};
enum class RankFate {
  kDesired,    // handed to the agent: it keeps or starts the rank
  kUnchanged,  // not desired, but the report is stale: the next heartbeat decides
  kStopping,   // not desired and still running there: the agent stops it
  kStopped,    // not desired and gone from the agent: its slot is free
};
// A rank is desired while it has not been told to stop, its job is SCHEDULED or RUNNING on
// this attempt, and the attempt is in flight. An undesired one is retired only on a fresh
// report (a late duplicate says nothing about now).
RankFate FateOfLiveRank(const LiveRank& rank, bool fresh_report);

// Heartbeat step 4a (nodes.proto): whether the answer names the rank's attempt in
// discarded_attempts, so that its agent SIGKILLs the rank at once. Only a rank whose attempt
// FAILED (so it is never desired) with discard_ranks set; every other undesired rank (a
// cancelled job's, a drained node's) is stopped with SIGTERM and the grace.
bool StopsAtOnce(const LiveRank& rank);

}  // namespace gradhub::api
