#include "services/api/scheduler.h"

#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <unordered_map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "services/api/attempts.h"
#include "services/api/scheduling_rules.h"
#include "services/common/contract/job_spec.h"
#include "services/common/contract/job_states.h"
#include "services/common/contract/unreachable_nodes.h"
#include "services/common/job_records.h"
#include "services/common/status_macros.h"

namespace gradhub::api {
namespace {

// pg_advisory_xact_lock key of the scheduler: "gradhub" "sched" in ASCII, arbitrary but fixed.
constexpr int64_t kSchedulerLock = 0x6772616468756273;

double Seconds(absl::Duration d) { return absl::ToDoubleSeconds(d); }

// The idle time after a pass, as a multiple of the time the pass took (see Start).
constexpr int kPassSpacing = 9;

// The loop's failed passes on stderr: one line when passes start failing, then one every
// kEvery while they go on, and one when they succeed again. A pass a tenth of a second would
// otherwise write ten lines a second for as long as the database is unreachable.
class PassLog {
 public:
  static constexpr absl::Duration kEvery = absl::Seconds(10);

  void Report(const absl::Status& status) {
    if (status.ok()) {
      if (failed_ > 0) {
        std::cerr << "gradhub-api: scheduler passes succeed again, after " << failed_
                  << " failed\n";
      }
      failed_ = 0;
      return;
    }
    const absl::Time now = absl::Now();
    if (++failed_ == 1 || now - last_line_ >= kEvery) {
      std::cerr << "gradhub-api: scheduler pass failed";
      if (failed_ > 1) std::cerr << " (" << failed_ << " in a row)";
      std::cerr << ": " << status << "\n";
      last_line_ = now;
    }
  }

 private:
  int64_t failed_ = 0;
  absl::Time last_line_ = absl::InfinitePast();
};

absl::StatusOr<std::vector<NodeRecord>> ReadNodes(db::Transaction& tx, absl::Duration lease) {
  GRADHUB_ASSIGN_OR_RETURN(
      db::Result rows,
      tx.Exec(
          absl::StrCat(
              "SELECT n.id, n.name, n.slots, n.device_kind, n.labels::text AS labels,"
              " n.data_roots::text AS data_roots, n.master_port_base,"
              " n.tenant_data_roots::text AS tenant_data_roots, n.memory_per_slot_bytes,"
              " n.state, n.last_heartbeat_time > now() - $1 * interval '1 second' AS heartbeating,"
              " (SELECT coalesce(string_agg(a.slot::text, ','), '') FROM rank_assignments a"
              "   WHERE a.node_id = n.id AND a.state IN ",
              kLiveRankStatesSql,
              ") AS used"
              " FROM nodes n WHERE n.state <> 'LOST' ORDER BY n.name"),
          {Seconds(lease)}));
  std::vector<NodeRecord> nodes;
  for (const db::Row& row : rows) {
    NodeRecord node;
    node.id = row.Get<int64_t>("id");
    node.name = row.Get<std::string>("name");
    v1::Node::State_Parse(row.Get<std::string>("state"), &node.state);
    node.heartbeating = row.Get<bool>("heartbeating");
    node.master_port_base = row.Get<int32_t>("master_port_base");
    v1::Node::DeviceKind_Parse(row.Get<std::string>("device_kind"), &node.kind);
    // Named: a range-for over a temporary's items() would outlive the temporary.
    const nlohmann::json labels = nlohmann::json::parse(row.Get<std::string>("labels"));
    for (const auto& [key, value] : labels.items()) {
      if (value.is_string()) node.labels[key] = value.get<std::string>();
    }
    for (const auto& root : nlohmann::json::parse(row.Get<std::string>("data_roots"))) {
      node.data_roots.push_back(root.get<std::string>());
    }
    for (const auto& root : nlohmann::json::parse(row.Get<std::string>("tenant_data_roots"))) {
      node.tenant_data_roots.push_back(
          {root.value("tenant", std::string()), root.value("path", std::string())});
    }
    node.memory_per_slot_bytes = row.Get<int64_t>("memory_per_slot_bytes");
    node.slots = row.Get<int32_t>("slots");
    std::set<int32_t> used;
    for (absl::string_view slot :
         absl::StrSplit(row.Get<std::string>("used"), ',', absl::SkipEmpty())) {
      used.insert(std::stoi(std::string(slot)));
    }
    for (int32_t slot = 0; slot < row.Get<int32_t>("slots"); ++slot) {
      if (!used.count(slot)) node.free_slots.push_back(slot);
    }
    nodes.push_back(std::move(node));
  }
  return nodes;
}

// Where the queue row `row` stands (QueuePosition: priority, submission time, job id).
QueuePosition PositionOf(const db::Row& row) {
  return {row.Get<int32_t>("priority"), row.Get<int64_t>("create_us"),
          row.Get<std::string>("name")};
}

// The queue as one pass reads it: the waiting jobs (rows in no order), and what FairShareOrder
// needs of their tenants.
struct QueueSnapshot {
  db::Result jobs;
  std::unordered_map<int64_t, std::string> tenant_names;  // tenant id -> tenants/NAME
  std::map<std::string, int64_t> held_slots;              // tenants/NAME -> slots of live ranks
};

absl::StatusOr<QueueSnapshot> ReadQueue(db::Pool& pool) {
  // Of each job only what placement reads, in no order: PostgreSQL's sort of a long queue
  // cost more than its scan (and spilled to disk past work_mem once the table had statistics),
  // while FairShareOrder takes a few milliseconds. One backend: a parallel scan would take
  // every core of a small database host while it lasts, and CreateJob's latency with them.
  // The tenants are read after the jobs: a waiting job's tenant cannot be deleted.
  return pool.Transact(
      [&](db::Transaction& tx) -> absl::StatusOr<QueueSnapshot> {
        GRADHUB_RETURN_IF_ERROR(tx.Exec("SET LOCAL max_parallel_workers_per_gather = 0").status());
        GRADHUB_ASSIGN_OR_RETURN(
            db::Result jobs,
            tx.Exec(absl::StrCat(
                "SELECT 'jobs/' || j.id::text AS name, j.priority, j.tenant_id, j.world_size,"
                " (extract(epoch FROM j.create_time) * 1e6)::bigint AS create_us,"
                " j.state_reason, j.current_attempt,"
                " extract(epoch FROM now() - j.queued_time)::float8 AS waited_s,"
                " j.state = 'RESTARTING' AND EXISTS (SELECT 1 FROM rank_assignments a"
                "   WHERE a.job_id = j.id AND a.state IN ",
                kLiveRankStatesSql,
                ") AS stopping"
                " FROM jobs j WHERE j.state IN ('PENDING', 'RESTARTING')")));
        GRADHUB_ASSIGN_OR_RETURN(
            db::Result tenants,
            tx.Exec(absl::StrCat(
                "SELECT t.id, 'tenants/' || t.name AS tenant, coalesce(h.slots, 0) AS slots"
                " FROM tenants t LEFT JOIN (SELECT j.tenant_id, count(*)::bigint AS slots"
                "   FROM rank_assignments a JOIN jobs j ON j.id = a.job_id WHERE a.state IN ",
                kLiveRankStatesSql, " GROUP BY j.tenant_id) h ON h.tenant_id = t.id")));
        QueueSnapshot queue{std::move(jobs), {}, {}};
        for (const db::Row& row : tenants) {
          const std::string tenant = row.Get<std::string>("tenant");
          queue.tenant_names[row.Get<int64_t>("id")] = tenant;
          queue.held_slots[tenant] = row.Get<int64_t>("slots");
        }
        return queue;
      },
      {.read_only = true});
}

// The queue's jobs as FairShareOrder takes them, in the order of its rows.
std::vector<FairShareEntry> FairShareEntries(const QueueSnapshot& queue) {
  std::vector<FairShareEntry> entries;
  entries.reserve(static_cast<size_t>(queue.jobs.rows()));
  for (const db::Row& row : queue.jobs) {
    const auto tenant = queue.tenant_names.find(row.Get<int64_t>("tenant_id"));
    entries.push_back({PositionOf(row), tenant == queue.tenant_names.end() ? "" : tenant->second,
                       row.Get<int32_t>("world_size")});
  }
  return entries;
}

// The rows of `queue` in QueuePosition order (the fast path's new jobs).
std::vector<int> QueueOrder(const db::Result& queue) {
  std::vector<std::pair<QueuePosition, int>> keys;
  keys.reserve(static_cast<size_t>(queue.rows()));
  for (int i = 0; i < queue.rows(); ++i) keys.emplace_back(PositionOf(queue.row(i)), i);
  std::sort(keys.begin(), keys.end(),
            [](const auto& a, const auto& b) { return a.first.Before(b.first); });
  std::vector<int> order;
  order.reserve(keys.size());
  for (const auto& key : keys) order.push_back(key.second);
  return order;
}

// A uuid[] parameter in PostgreSQL's array syntax (uuids need no quoting).
std::string UuidArray(const std::vector<std::string>& ids) {
  return absl::StrCat("{", absl::StrJoin(ids, ","), "}");
}

absl::Status SetPendingReason(db::Transaction& tx, const v1::Job& job, const std::string& why) {
  if (job.state_reason() == why) return absl::OkStatus();
  return tx.Exec("UPDATE jobs SET state_reason = $2 WHERE id = $1::uuid", {JobId(job.name()), why})
      .status();
}

// Creates the next attempt of `job` with its ranks where `placement` says, and schedules it.
absl::Status CreateAttempt(db::Transaction& tx, v1::Job job, const GangPlacement& placement) {
  const std::string id = JobId(job.name());
  const int32_t attempt = job.attempt() + 1;
  GRADHUB_RETURN_IF_ERROR(
      tx.Exec("INSERT INTO job_attempts (job_id, attempt, rendezvous_prefix)"
              " VALUES ($1::uuid, $2, $3)",
              {id, attempt, absl::StrCat("jobs/", id, "/attempts/", attempt, "/")})
          .status());
  GRADHUB_RETURN_IF_ERROR(
      tx.Exec("UPDATE jobs SET current_attempt = $2 WHERE id = $1::uuid", {id, attempt}).status());
  for (const RankPlacement& rank : placement.ranks) {
    GRADHUB_RETURN_IF_ERROR(
        tx.Exec("INSERT INTO rank_assignments (job_id, attempt, rank, node_id, local_rank, slot)"
                " VALUES ($1::uuid, $2, $3, $4, $5, $6)",
                {id, attempt, rank.rank, rank.node_id, rank.local_rank, rank.slot})
            .status());
  }
  job.set_attempt(attempt);
  return ApplyTransition(tx, job, v1::Job::SCHEDULED, Because(PlacementMessage(attempt, placement)))
      .status();
}

// Marks an attempt whose job ended (cancelled) or moved on as ended with it, and asks its live
// ranks to stop.
absl::Status EndAttemptWithItsJob(db::Transaction& tx, const v1::Job& job, int32_t attempt) {
  const std::string id = JobId(job.name());
  const bool cancelled = job.state() == v1::Job::CANCELLED || job.state() == v1::Job::CANCELLING;
  const std::string ended = cancelled                           ? "CANCELLED"
                            : job.state() == v1::Job::SUCCEEDED ? "SUCCEEDED"
                                                                : "FAILED";
  GRADHUB_RETURN_IF_ERROR(tx.Exec("UPDATE job_attempts SET state = $3, end_time = now()"
                                  " WHERE job_id = $1::uuid AND attempt = $2",
                                  {id, attempt, ended})
                              .status());
  return tx
      .Exec(absl::StrCat("UPDATE rank_assignments SET state = 'STOPPING', update_time = now()"
                         " WHERE job_id = $1::uuid AND attempt = $2 AND state IN ",
                         kRunnableRankStatesSql),
            {id, attempt})
      .status();
}

// What JudgeAttempt needs of the current attempt of `job` (read FOR UPDATE in `tx`); nullopt
// when the attempt is not in flight any more.
absl::StatusOr<std::optional<AttemptSnapshot>> ReadAttemptSnapshot(db::Transaction& tx,
                                                                   const v1::Job& job) {
  const std::string id = JobId(job.name());
  GRADHUB_ASSIGN_OR_RETURN(db::Result attempt_row,
                           tx.Exec("SELECT state, extract(epoch FROM now() - greatest(create_time,"
                                   " coalesce(start_time, create_time)))::float8 AS idle_s"
                                   " FROM job_attempts WHERE job_id = $1::uuid AND attempt = $2",
                                   {id, job.attempt()}));
  if (attempt_row.empty()) return std::nullopt;
  const std::string state = attempt_row.row(0).Get<std::string>("state");
  if (state != "SCHEDULED" && state != "RUNNING") return std::nullopt;
  AttemptSnapshot snapshot;
  snapshot.job_state = job.state();
  // The stored spec is as submitted: its defaults apply here.
  snapshot.hang_timeout_seconds = WithDefaults(job.spec()).hang_timeout_seconds();
  snapshot.script = job.spec().has_script();
  snapshot.seconds_since_start = attempt_row.row(0).Get<double>("idle_s");
  GRADHUB_ASSIGN_OR_RETURN(
      db::Result rank_rows,
      tx.Exec("SELECT a.rank, a.state, n.name AS node, a.message,"
              " coalesce(a.exit_code, 0) AS exit_code, coalesce(a.signal, 0) AS signal,"
              " extract(epoch FROM now() - a.update_time)::float8 AS age_s,"
              " extract(epoch FROM now() - a.last_step_time)::float8 AS step_age_s"
              " FROM rank_assignments a JOIN nodes n ON n.id = a.node_id"
              " WHERE a.job_id = $1::uuid AND a.attempt = $2 ORDER BY a.update_time, a.rank",
              {id, job.attempt()}));
  for (const db::Row& row : rank_rows) {
    snapshot.ranks.push_back({row.Get<int32_t>("rank"), row.Get<std::string>("state"),
                              row.Get<std::string>("node"), row.Get<std::string>("message"),
                              row.Get<int32_t>("exit_code"), row.Get<int32_t>("signal"),
                              row.Get<double>("age_s")});
    if (!row.IsNull("step_age_s")) {
      const double age = row.Get<double>("step_age_s");
      snapshot.seconds_since_step = std::min(snapshot.seconds_since_step.value_or(age), age);
    }
  }
  return snapshot;
}

// Writes JudgeAttempt's verdict on the current attempt of `job`. Returns the time the job
// waited in the queue when the verdict made it RUNNING.
absl::StatusOr<std::optional<double>> ApplyVerdict(db::Transaction& tx, v1::Job job,
                                                   const AttemptVerdict& verdict) {
  if (verdict.failure) {
    GRADHUB_RETURN_IF_ERROR(FailAttempt(tx, job, *verdict.failure));
    return std::nullopt;
  }
  const std::string id = JobId(job.name());
  std::optional<double> queued_seconds;
  if (verdict.now_running) {
    GRADHUB_ASSIGN_OR_RETURN(
        db::Result started, tx.Exec("UPDATE job_attempts SET state = 'RUNNING', start_time = now()"
                                    " WHERE job_id = $1::uuid AND attempt = $2 RETURNING (SELECT"
                                    " extract(epoch FROM now() - j.queued_time)::float8 FROM jobs j"
                                    " WHERE j.id = $1::uuid) AS queued_s",
                                    {id, job.attempt()}));
    if (!started.empty()) queued_seconds = started.row(0).Get<double>("queued_s");
    GRADHUB_ASSIGN_OR_RETURN(
        job, ApplyTransition(tx, job, v1::Job::RUNNING, Because(verdict.started_reason)));
  }
  if (verdict.succeeded) {
    GRADHUB_RETURN_IF_ERROR(tx.Exec("UPDATE job_attempts SET state = 'SUCCEEDED',"
                                    " end_time = now() WHERE job_id = $1::uuid AND attempt = $2",
                                    {id, job.attempt()})
                                .status());
    GRADHUB_RETURN_IF_ERROR(
        ApplyTransition(tx, job, v1::Job::SUCCEEDED, Because(verdict.succeeded_reason)).status());
  }
  return queued_seconds;
}

}  // namespace

absl::Status Scheduler::LockAsLeader(db::Transaction& tx) {
  if (options_.leader != nullptr) {
    GRADHUB_RETURN_IF_ERROR(options_.leader->Fence(tx, term_.number));
  }
  return tx.Exec("SELECT pg_advisory_xact_lock($1)", {kSchedulerLock}).status();
}

bool Scheduler::TakeTerm() {
  if (options_.leader == nullptr) {
    term_ = LeaderTerm{.number = 0, .began = start_time_};
    return true;
  }
  const std::optional<LeaderTerm> term = options_.leader->Current();
  if (!term) return false;
  // Another term may follow another leader's passes: what this replica remembers of the
  // queue (verdict_) is of its old term, which the fast path does not trust.
  term_ = *term;
  return true;
}

absl::Time Scheduler::RecordableSince() const {
  return HeartbeatsRecordableSince(term_.began, pool_->last_unreachable());
}

absl::Status Scheduler::RunOnce() {
  std::lock_guard<std::mutex> one_pass_at_a_time(pass_mu_);
  if (!TakeTerm()) {  // another replica leads (leader_lease.h)
    {
      // A term of this replica's begins with a full pass (QueueNeedsFullPass rule 1).
      std::lock_guard<std::mutex> lock(mu_);
      told_.unjudged.clear();
    }
    queued_specs_.DropOffers();
    PublishJudge(nullptr);
    return absl::OkStatus();
  }
  GRADHUB_RETURN_IF_ERROR(SweepNodes());
  GRADHUB_RETURN_IF_ERROR(ReconcileAttempts());
  GRADHUB_RETURN_IF_ERROR(FinishCancellations());
  return ServeQueue();
}

absl::Status Scheduler::ServeQueue() {
  GRADHUB_ASSIGN_OR_RETURN(
      std::vector<NodeRecord> nodes,
      pool_->Transact([&](db::Transaction& tx) { return ReadNodes(tx, options_.node_lease); },
                      {.read_only = true}));
  const absl::Time now = absl::Now();
  QueueWatch watch{.full_pass_in_term = verdict_.term == term_.number,
                   .some_node_free = AnyNodeTakesARank(nodes),
                   .since_full_pass = now - verdict_.full_pass_began};
  node_was_free_ = watch.some_node_free;
  std::vector<std::string> unjudged;
  bool full = false;
  {
    // Taken together: a job created or a Nudge from now on is this pass's to miss, so the next
    // pass's.
    std::lock_guard<std::mutex> lock(mu_);
    watch.changed = told_.queue_changed;
    full = QueueNeedsFullPass(watch, options_.queue_refresh);
    if (full) told_.queue_changed = false;
    unjudged.swap(told_.unjudged);  // a full pass reads them with the rest of the queue
  }
  if (full) {
    verdict_.full_pass_began = now;
    std::optional<std::vector<NodeRecord>> none_free;  // for the judge: nothing is placed on them
    if (!watch.some_node_free) none_free = nodes;
    absl::Status status = PlaceJobs(std::move(nodes));
    if (!status.ok()) verdict_.term = -1;  // rule 1 again: its verdicts are not whole
    PublishJudge(status.ok() && none_free
                     ? std::make_shared<NewJobJudge>(*std::move(none_free), verdict_,
                                                     options_.backfill_window)
                     : nullptr);
    return status;
  }
  auto judge = std::make_shared<NewJobJudge>(std::move(nodes), verdict_, options_.backfill_window);
  verdict_.some_node_free = false;  // the light pass runs only then (QueueNeedsFullPass)
  absl::Status status = JudgeNewJobs(unjudged, *judge);
  if (!status.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    told_.unjudged.insert(told_.unjudged.end(), unjudged.begin(), unjudged.end());
  }
  PublishJudge(std::move(judge));
  return status;
}

namespace {

absl::StatusOr<bool> AnyNodeToSweep(db::Transaction& tx, absl::Duration node_lease) {
  // Every node DeclareLostNodes or ApplyDrains would look at, and more (the grace is theirs).
  GRADHUB_ASSIGN_OR_RETURN(
      const db::Result any,
      tx.Exec("SELECT EXISTS (SELECT 1 FROM nodes WHERE state = 'DRAINING' OR (state <> 'LOST'"
              " AND last_heartbeat_time < now() - $1 * interval '1 second')) AS any",
              {Seconds(node_lease)}));
  return any.row(0).Get<bool>("any");
}

}  // namespace

absl::Status Scheduler::SweepNodes() {
  // Most passes find no node to sweep; such a pass takes no lock. The fence's row lock makes
  // its transaction a durable commit (a WAL flush): five a second, each holding up the
  // commits of everything else that waits for the WAL then (CreateJob's among them). A node
  // that falls silent after this look is swept by the next pass, one interval later, as one
  // that falls silent just after the sweep would be.
  GRADHUB_ASSIGN_OR_RETURN(
      const bool any,
      pool_->Transact([&](db::Transaction& tx) { return AnyNodeToSweep(tx, options_.node_lease); },
                      {.read_only = true}));
  if (!any) return absl::OkStatus();
  absl::Status status = pool_->Transact([&](db::Transaction& tx) -> absl::Status {
    GRADHUB_RETURN_IF_ERROR(LockAsLeader(tx));
    GRADHUB_RETURN_IF_ERROR(DeclareLostNodes(tx));
    return ApplyDrains(tx);
  });
  AssignmentsChanged();
  return status;
}

void Scheduler::AssignmentsChanged() {
  if (assignments_changed_.exchange(false) && options_.on_assignments_changed) {
    options_.on_assignments_changed();
  }
}

absl::Status Scheduler::DeclareLostNodes(db::Transaction& tx) {
  // Protocol steps 2 and 6 (scheduler.h): right after this api started, or its database came
  // back, a node's last heartbeat may be older than the lease only because nothing could take
  // it. Its agent keeps its ranks running (up to its --api-outage-grace) and gets through within
  // a few seconds; until startup_grace has passed, silence proves nothing.
  const absl::Time recordable_since = RecordableSince();
  const bool may_lose = MayDeclareNodesLost(absl::Now(), recordable_since, options_.startup_grace);
  // Every node silent past the lease, locked against its heartbeat until this commits, with
  // what SilentNodeIsLost needs: whether a rank of one of its attempts starts or runs on a
  // node that is heartbeating.
  GRADHUB_ASSIGN_OR_RETURN(
      db::Result silent,
      // A node that has heartbeated since then needs no grace: its silence is its own.
      // (Compares the api's clock with the database's: they must agree to well under a lease,
      // as NTP keeps them.)
      tx.Exec(absl::StrCat(
                  "SELECT n.id, n.name,"
                  " extract(epoch FROM now() - n.last_heartbeat_time)::float8 AS silent_s,"
                  " EXISTS (SELECT 1 FROM rank_assignments mine JOIN rank_assignments peer"
                  "   ON peer.job_id = mine.job_id AND peer.attempt = mine.attempt"
                  "   AND peer.node_id <> mine.node_id AND peer.state IN ('STARTING', 'RUNNING')"
                  "   JOIN nodes pn ON pn.id = peer.node_id"
                  "   AND pn.last_heartbeat_time > now() - $1 * interval '1 second'"
                  "   WHERE mine.node_id = n.id AND mine.state IN ",
                  kLiveRankStatesSql,
                  ") AS live_peers"
                  " FROM nodes n WHERE n.state <> 'LOST'"
                  " AND n.last_heartbeat_time < now() - $1 * interval '1 second'"
                  " AND ($2 OR n.last_heartbeat_time > to_timestamp($3))"
                  " ORDER BY n.id FOR UPDATE OF n"),
              {Seconds(options_.node_lease), may_lose,
               absl::ToDoubleSeconds(recordable_since - absl::UnixEpoch())}));
  for (const db::Row& row : silent) {
    const double silent_s = row.Get<double>("silent_s");
    if (!SilentNodeIsLost(absl::Seconds(silent_s), options_.node_outage_grace,
                          row.Get<bool>("live_peers"))) {
      continue;
    }
    const int64_t id = row.Get<int64_t>("id");
    GRADHUB_RETURN_IF_ERROR(
        tx.Exec("UPDATE nodes SET state = 'LOST', session_id = NULL WHERE id = $1", {id}).status());
    MarkAssignmentsChanged();  // the attempts' ranks on other nodes are to stop
    const std::string name = row.Get<std::string>("name");
    GRADHUB_RETURN_IF_ERROR(
        ForgetRanksOnNode(tx, id, name, NodeLostReason(name, silent_s, options_.node_lease)));
  }
  return absl::OkStatus();
}

absl::Status Scheduler::ApplyDrains(db::Transaction& tx) {
  GRADHUB_ASSIGN_OR_RETURN(
      db::Result rows,
      tx.Exec(absl::StrCat("SELECT DISTINCT n.id, n.name, a.job_id::text AS job_id, a.attempt,"
                           " a.rank FROM nodes n LEFT JOIN rank_assignments a ON a.node_id = n.id"
                           " AND a.state IN ",
                           kLiveRankStatesSql,
                           " WHERE n.state = 'DRAINING' ORDER BY n.id, a.rank")));
  std::vector<DrainingRank> draining;
  for (const db::Row& row : rows) {
    DrainingRank rank{row.Get<int64_t>("id"), row.Get<std::string>("name")};
    if (!row.IsNull("job_id")) {
      rank.job_id = row.Get<std::string>("job_id");
      rank.attempt = row.Get<int32_t>("attempt");
      rank.rank = row.Get<int32_t>("rank");
    }
    draining.push_back(std::move(rank));
  }
  const DrainPlan plan = PlanDrains(draining);
  for (const DrainPlan::Restart& restart : plan.restarts) {
    GRADHUB_ASSIGN_OR_RETURN(v1::Job job, ReadJob(tx, "jobs/" + restart.job_id, -1, true));
    if (job.attempt() != restart.attempt) continue;
    MarkAssignmentsChanged();
    GRADHUB_RETURN_IF_ERROR(FailAttempt(tx, job, restart.failure));
  }
  for (const int64_t node : plan.cordon) {
    GRADHUB_RETURN_IF_ERROR(
        tx.Exec("UPDATE nodes SET state = 'CORDONED' WHERE id = $1 AND state = 'DRAINING'", {node})
            .status());
  }
  return absl::OkStatus();
}

absl::Status Scheduler::ReconcileAttempts() {
  GRADHUB_ASSIGN_OR_RETURN(
      db::Result active,
      pool_->Exec("SELECT job_id::text AS job_id, attempt FROM job_attempts"
                  " WHERE state IN ('SCHEDULED', 'RUNNING') ORDER BY create_time"));
  for (const db::Row& entry : active) {
    const std::string name = "jobs/" + entry.Get<std::string>("job_id");
    const int32_t attempt = entry.Get<int32_t>("attempt");
    absl::StatusOr<std::optional<double>> queued = ReconcileAttempt(name, attempt);
    AssignmentsChanged();
    if (!queued.ok()) {
      std::cerr << "gradhub-api: scheduler: " << name << " attempt " << attempt << ": "
                << queued.status() << "\n";
    } else if (*queued && options_.on_running) {
      options_.on_running(absl::Seconds(**queued));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Scheduler::AttemptReview> Scheduler::ReviewAttempt(db::Transaction& tx,
                                                                  const std::string& name,
                                                                  int32_t attempt, bool lock) {
  AttemptReview review;
  GRADHUB_ASSIGN_OR_RETURN(review.job, ReadJob(tx, name, -1, lock));
  const v1::Job& job = review.job;
  // A job that ended (cancelled) or moved on takes its attempt with it.
  if (job.attempt() != attempt || IsTerminal(job.state()) || job.state() == v1::Job::CANCELLING) {
    GRADHUB_ASSIGN_OR_RETURN(
        db::Result in_flight,
        tx.Exec("SELECT 1 FROM job_attempts WHERE job_id = $1::uuid AND attempt = $2"
                " AND state IN ('SCHEDULED', 'RUNNING')",
                {JobId(name), attempt}));
    review.end_with_job = !in_flight.empty();
    return review;
  }
  GRADHUB_ASSIGN_OR_RETURN(std::optional<AttemptSnapshot> snapshot, ReadAttemptSnapshot(tx, job));
  if (!snapshot) return review;
  snapshot->seconds_since_recordable = Seconds(absl::Now() - RecordableSince());
  // A script's exit may be its peer's loss: wait a node lease more, so a lost node is found.
  review.verdict =
      JudgeAttempt(*snapshot, options_.peer_failure_grace +
                                  (snapshot->script ? options_.node_lease : absl::ZeroDuration()));
  return review;
}

absl::StatusOr<std::optional<double>> Scheduler::ReconcileAttempt(const std::string& name,
                                                                  int32_t attempt) {
  // 1. A look without locks. Most attempts at most passes run on with nothing to write, and the
  //    fenced transaction of step 2 is a durable commit (its row locks): one WAL flush per
  //    attempt in flight per pass, beside every other commit of the cluster.
  GRADHUB_ASSIGN_OR_RETURN(
      const AttemptReview look,
      pool_->Transact([&](db::Transaction& tx) { return ReviewAttempt(tx, name, attempt, false); },
                      {.read_only = true}));
  if (!look.NeedsWrite()) return std::nullopt;
  // 2. Under the fence, the job locked: reviewed again (another replica's heartbeat may have
  //    changed it since), and the review applied. A verdict that came due between the two
  //    looks is applied by the next pass.
  return pool_->Transact([&](db::Transaction& tx) -> absl::StatusOr<std::optional<double>> {
    GRADHUB_RETURN_IF_ERROR(LockAsLeader(tx));
    GRADHUB_ASSIGN_OR_RETURN(const AttemptReview review, ReviewAttempt(tx, name, attempt, true));
    if (review.end_with_job) {
      MarkAssignmentsChanged();
      GRADHUB_RETURN_IF_ERROR(EndAttemptWithItsJob(tx, review.job, attempt));
      return std::nullopt;
    }
    if (!review.verdict) return std::nullopt;
    if (review.verdict->failure) MarkAssignmentsChanged();
    return ApplyVerdict(tx, review.job, *review.verdict);
  });
}

absl::Status Scheduler::FinishCancellations() {
  // Step 3: CANCELLING lasts while any rank of the job is live (not yet reported gone by its
  // agent, nor forgotten with a lost node); then the job is CANCELLED.
  GRADHUB_ASSIGN_OR_RETURN(
      db::Result done,
      pool_->Exec(absl::StrCat(
          "SELECT 'jobs/' || j.id::text AS name FROM jobs j WHERE j.state = 'CANCELLING'"
          " AND NOT EXISTS (SELECT 1 FROM rank_assignments a WHERE a.job_id = j.id"
          "   AND a.state IN ",
          kLiveRankStatesSql, ")")));
  for (const db::Row& row : done) {
    const std::string name = row.Get<std::string>("name");
    absl::Status status = pool_->Transact([&](db::Transaction& tx) -> absl::Status {
      GRADHUB_RETURN_IF_ERROR(LockAsLeader(tx));
      GRADHUB_ASSIGN_OR_RETURN(v1::Job job, ReadJob(tx, name, -1, true));
      if (job.state() != v1::Job::CANCELLING) return absl::OkStatus();
      GRADHUB_ASSIGN_OR_RETURN(
          db::Result live,
          tx.Exec(absl::StrCat("SELECT 1 FROM rank_assignments WHERE job_id = $1::uuid"
                               " AND state IN ",
                               kLiveRankStatesSql, " LIMIT 1"),
                  {JobId(name)}));
      if (!live.empty()) return absl::OkStatus();
      // The reason CancelJob gave ("cancelled by the user: ...; stopping 4 ranks"), now done.
      const std::string why = job.state_reason().substr(0, job.state_reason().find("; stopping "));
      return ApplyTransition(
                 tx, job, v1::Job::CANCELLED,
                 Because(absl::StrCat(why.empty() ? "cancelled" : why, "; every rank has stopped")))
          .status();
    });
    if (!status.ok()) {
      std::cerr << "gradhub-api: scheduler: finishing the cancellation of " << name << ": "
                << status << "\n";
    }
  }
  return absl::OkStatus();
}

absl::Status Scheduler::PlaceJobs(std::vector<NodeRecord> snapshot) {
  // The queue and the nodes are read once per pass without locks, and QueuePass decides each
  // job against that snapshot, in FairShareOrder. A job that cannot be placed in it and
  // already says why is left alone: taking its row lock would make every waiting job a durable
  // commit on every pass. A placement is decided again (QueuePass::Confirm) in a transaction
  // under the scheduler lock from what it reads there, then written.
  GRADHUB_ASSIGN_OR_RETURN(const QueueSnapshot queue, ReadQueue(*pool_));
  GRADHUB_ASSIGN_OR_RETURN(const std::vector<const QueuedSpecs::Entry*> specs,
                           queued_specs_.Read(*pool_, queue.jobs));
  const bool some_node_free = AnyNodeTakesARank(snapshot);  // for the fast path
  QueuePass pass(std::move(snapshot), options_.backfill_window);
  FairShareOrder order(FairShareEntries(queue), queue.held_slots);
  // Reasons are written together at the end of the pass, one statement per distinct reason:
  // a burst of submissions to a full cluster would otherwise cost one more durable commit per
  // new job. They are only advice to the user, so the snapshot is good enough for them; a
  // placement is still decided under the lock.
  std::map<std::string, std::vector<std::string>> new_reasons;  // why -> job ids
  verdict_.blocking.reset();
  while (const std::optional<size_t> i = order.Next()) {
    if (stopping_) break;  // SIGTERM: the next api picks the queue up where this one left it
    const db::Row entry = queue.jobs.row(static_cast<int>(*i));
    QueuedJob job;
    job.name = entry.Get<std::string>("name");
    job.attempt = entry.Get<int32_t>("current_attempt");
    job.stopping = entry.Get<bool>("stopping");
    job.waited = absl::Seconds(entry.Get<double>("waited_s"));
    // Unreadable (not cached) means decided in the transaction, from the whole stored job.
    if (const QueuedSpecs::Entry* cached = specs[*i]; cached != nullptr) {
      job.spec = &cached->spec;
      job.shape = cached->shape;
      job.tenant = cached->tenant;
      const GangPlacement guess = pass.Next(job);
      if (!guess.placed()) {
        if (guess.why != entry.Get<std::string>("state_reason")) {
          new_reasons[guess.why].push_back(JobId(job.name));
        }
        continue;
      }
    }
    PlaceAndTell(std::move(job), pass, &order);
  }
  NoteBlockingJob(queue.jobs, pass);
  verdict_.some_node_free = some_node_free;
  verdict_.term = stopping_ ? -1 : term_.number;
  return SetPendingReasons(new_reasons);
}

void Scheduler::PlaceAndTell(QueuedJob job, QueuePass& pass, FairShareOrder* order) {
  const std::string name = job.name;
  const absl::StatusOr<bool> placed = PlaceJob(std::move(job), pass);
  AssignmentsChanged();  // at once, not at the end of the pass: the agents start the ranks
  if (!placed.ok()) {
    std::cerr << "gradhub-api: scheduler: placing " << name << ": " << placed.status() << "\n";
  } else if (*placed && order != nullptr) {
    order->Placed();
  }
}

void Scheduler::NoteBlockingJob(const db::Result& queue, const QueuePass& pass) {
  verdict_.blocking.reset();
  if (!pass.blocked_by()) return;
  verdict_.blocking_tenant = pass.blocked_tenant();
  for (const db::Row& entry : queue) {
    if (entry.Get<std::string>("name") == *pass.blocked_by()) verdict_.blocking = PositionOf(entry);
  }
}

absl::Status Scheduler::PlaceNewJobs(const std::vector<std::string>& names) {
  std::lock_guard<std::mutex> one_pass_at_a_time(pass_mu_);
  // Not leading, or no full pass yet in this term: the next pass places them.
  if (!TakeTerm() || verdict_.term != term_.number) return absl::OkStatus();
  // A cluster that is full (or has no ready node) is the common case while a queue builds up:
  // then no new job can be placed, and trying each in a transaction of its own (fence, job,
  // nodes, reason) was half the statements PostgreSQL ran per CreateJob and a sixth of the
  // api's CPU (tests/bench/create_jobs). The last pass's look at the nodes decides for all of
  // them when it found none free, since no capacity was freed after it (or this would not
  // run); else one look now. A slot freed after either nudges a pass, as one freed after
  // PlaceJob's look would.
  if (!verdict_.some_node_free) return absl::OkStatus();  // the next pass says why they wait
  GRADHUB_ASSIGN_OR_RETURN(
      const std::vector<NodeRecord> nodes,
      pool_->Transact([&](db::Transaction& tx) { return ReadNodes(tx, options_.node_lease); },
                      {.read_only = true}));
  if (!AnyNodeTakesARank(nodes)) return absl::OkStatus();  // the next pass says why they wait
  std::vector<std::string> ids;
  for (const std::string& name : names) ids.push_back(JobId(name));
  GRADHUB_ASSIGN_OR_RETURN(
      const db::Result rows,
      pool_->Exec("SELECT 'jobs/' || j.id::text AS name, j.priority,"
                  " (extract(epoch FROM j.create_time) * 1e6)::bigint AS create_us,"
                  " j.current_attempt, extract(epoch FROM now() - j.queued_time)::float8 AS"
                  " waited_s FROM jobs j WHERE j.id = ANY($1::uuid[]) AND j.state = 'PENDING'",
                  {UuidArray(ids)}));
  QueuePass pass({}, options_.backfill_window);  // Confirm reads the nodes under the lock
  for (const int i : QueueOrder(rows)) {
    const db::Row row = rows.row(i);
    const QueuePosition position = PositionOf(row);
    // Capacity was unchanged when the jobs were handed over (WaitPlacingNewJobs).
    if (!FastPathMayPlace(position, verdict_.blocking, false)) continue;  // the next pass says why
    QueuedJob job;
    job.name = position.name;
    job.attempt = row.Get<int32_t>("current_attempt");
    job.waited = absl::Seconds(row.Get<double>("waited_s"));
    PlaceAndTell(std::move(job), pass, nullptr);
  }
  return absl::OkStatus();
}

Scheduler::NewJobJudge::NewJobJudge(std::vector<NodeRecord> nodes, const QueueVerdict& verdict,
                                    absl::Duration backfill_window)
    : blocking_(verdict.blocking),
      open_(nodes, backfill_window),
      closed_(std::move(nodes), backfill_window) {
  if (blocking_) closed_.CloseBehind(blocking_->name, verdict.blocking_tenant);
}

std::string Scheduler::NewJobJudge::Reason(const QueuedJob& job, int32_t priority) {
  // A job the last full pass would have served after the one that closed the queue gets that
  // pass's reason for it. FastPathMayPlace's test of "behind": of equal priority, fair share
  // might have served it first, which the next full pass says.
  QueuePosition position;
  position.priority = priority;
  const bool behind = !FastPathMayPlace(position, blocking_, false);
  std::lock_guard<std::mutex> lock(mu_);
  return (behind ? closed_ : open_).JudgeSubmitted(job).why;
}

absl::Status Scheduler::JudgeNewJobs(const std::vector<std::string>& names, NewJobJudge& judge) {
  if (names.empty()) return absl::OkStatus();
  std::vector<std::string> ids;
  for (const std::string& name : names) ids.push_back(JobId(name));
  // Only PENDING: a job submitted is never RESTARTING before a pass has placed it. Only those
  // stored without a reason: CreateJob stored ReasonForNewJob's where it had one.
  GRADHUB_ASSIGN_OR_RETURN(
      const db::Result rows,
      pool_->Exec("SELECT 'jobs/' || j.id::text AS name, j.priority FROM jobs j"
                  " WHERE j.id = ANY($1::uuid[]) AND j.state = 'PENDING' AND j.state_reason = ''",
                  {UuidArray(ids)}));
  GRADHUB_ASSIGN_OR_RETURN(const std::vector<const QueuedSpecs::Entry*> specs,
                           queued_specs_.Add(*pool_, rows));
  std::map<std::string, std::vector<std::string>> reasons;  // why -> job ids
  for (int i = 0; i < rows.rows(); ++i) {
    const QueuedSpecs::Entry* cached = specs[static_cast<size_t>(i)];
    if (cached == nullptr) continue;  // unreadable: the next full pass decides from the row
    QueuedJob job;
    job.name = rows.row(i).Get<std::string>("name");
    job.tenant = cached->tenant;
    job.spec = &cached->spec;
    job.shape = cached->shape;
    const std::string why = judge.Reason(job, rows.row(i).Get<int32_t>("priority"));
    if (why.empty()) {  // no node takes a rank, so it fits nowhere: should it, a full pass
      std::lock_guard<std::mutex> lock(mu_);
      told_.queue_changed = true;
      continue;
    }
    reasons[why].push_back(JobId(job.name));
  }
  return SetPendingReasons(reasons);
}

std::string Scheduler::ReasonForNewJob(const v1::JobSpec& spec, const std::string& tenant) {
  std::shared_ptr<NewJobJudge> judge;
  {
    std::lock_guard<std::mutex> lock(published_judge_.mu);
    judge = published_judge_.judge;
  }
  if (judge == nullptr) return "";
  QueuedJob job;
  job.tenant = tenant;
  job.spec = &spec;
  const std::string shape = PlacementShape(spec);
  job.shape = shape;
  return judge->Reason(job, spec.priority());
}

void Scheduler::PublishJudge(std::shared_ptr<NewJobJudge> judge) {
  std::lock_guard<std::mutex> lock(published_judge_.mu);
  published_judge_.judge = std::move(judge);
}

namespace {

// The pairs of nodes that could not reach each other in the job's last attempt, as its
// failure quotes its rank (contract/unreachable_nodes.h); none before a first attempt.
absl::StatusOr<std::vector<NodePair>> UnreachablePairsOfAttempt(db::Transaction& tx,
                                                                const v1::Job& job) {
  if (job.attempt() < 1) return std::vector<NodePair>{};
  GRADHUB_ASSIGN_OR_RETURN(
      db::Result rows, tx.Exec("SELECT coalesce(failure_message, '') AS failure FROM job_attempts"
                               " WHERE job_id = $1::uuid AND attempt = $2",
                               {JobId(job.name()), job.attempt()}));
  if (rows.empty()) return std::vector<NodePair>{};
  return UnreachablePairs(rows.row(0).Get<std::string>("failure"));
}

}  // namespace

absl::StatusOr<bool> Scheduler::PlaceJob(QueuedJob queued, QueuePass& pass) {
  return pool_->Transact([&](db::Transaction& tx) -> absl::StatusOr<bool> {
    GRADHUB_RETURN_IF_ERROR(LockAsLeader(tx));
    GRADHUB_ASSIGN_OR_RETURN(v1::Job job, ReadJob(tx, queued.name, -1, true));
    if (job.state() != v1::Job::PENDING && job.state() != v1::Job::RESTARTING) return false;
    GRADHUB_ASSIGN_OR_RETURN(const std::vector<NodeRecord> nodes,
                             ReadNodes(tx, options_.node_lease));
    const v1::JobSpec spec = WithDefaults(job.spec());  // stored as submitted
    queued.spec = &spec;
    queued.attempt = job.attempt();
    queued.tenant = job.tenant();
    GRADHUB_ASSIGN_OR_RETURN(queued.unreachable_pairs, UnreachablePairsOfAttempt(tx, job));
    const GangPlacement placement = pass.Confirm(queued, nodes);
    if (!placement.placed()) {
      GRADHUB_RETURN_IF_ERROR(SetPendingReason(tx, job, placement.why));
      return false;
    }
    MarkAssignmentsChanged();
    GRADHUB_RETURN_IF_ERROR(CreateAttempt(tx, job, placement));
    return true;
  });
}

absl::StatusOr<std::vector<const QueuedSpecs::Entry*>> QueuedSpecs::Read(db::Pool& pool,
                                                                         const db::Result& queue) {
  const uint64_t pass = ++passes_;
  for (const db::Row& row : queue) entries_[row.Get<std::string>("name")].seen_in_pass = pass;
  for (auto it = entries_.begin(); it != entries_.end();) {
    it = it->second.seen_in_pass == pass ? std::next(it) : entries_.erase(it);
  }
  return Add(pool, queue);
}

absl::StatusOr<std::vector<const QueuedSpecs::Entry*>> QueuedSpecs::Add(db::Pool& pool,
                                                                        const db::Result& jobs) {
  {
    std::lock_guard<std::mutex> lock(offers_mu_);
    for (auto& [name, offered] : offers_) {
      offered.shape = PlacementShape(offered.spec);  // here, not on the request's thread
      entries_.insert_or_assign(name, std::move(offered));
    }
    offers_.clear();
  }
  std::vector<Entry*> entries;
  entries.reserve(static_cast<size_t>(jobs.rows()));
  std::vector<std::string> missing;  // job ids
  for (const db::Row& row : jobs) {
    Entry& entry = entries_[row.Get<std::string>("name")];
    if (!entry.loaded) missing.push_back(JobId(row.Get<std::string>("name")));
    entries.push_back(&entry);
  }
  if (!missing.empty()) GRADHUB_RETURN_IF_ERROR(Load(pool, missing));
  std::vector<const Entry*> loaded;
  loaded.reserve(entries.size());
  for (const Entry* entry : entries) loaded.push_back(entry->loaded ? entry : nullptr);
  return loaded;
}

void QueuedSpecs::Offer(const std::string& name, const v1::JobSpec& spec,
                        const std::string& tenant) {
  Entry entry;  // its shape is computed when a pass takes it (Add)
  entry.loaded = true;
  entry.spec = spec;
  entry.tenant = tenant;
  std::lock_guard<std::mutex> lock(offers_mu_);
  offers_.insert_or_assign(name, std::move(entry));
}

void QueuedSpecs::DropOffers() {
  std::lock_guard<std::mutex> lock(offers_mu_);
  offers_.clear();
}

absl::Status QueuedSpecs::Load(db::Pool& pool, const std::vector<std::string>& ids) {
  // The whole stored spec, as PlaceJob reads it: a projection here once left out a field the
  // rules read (precision), and judged FP16 jobs as if they could run on CPU nodes.
  GRADHUB_ASSIGN_OR_RETURN(
      db::Result rows,
      pool.Exec("SELECT 'jobs/' || j.id::text AS name, j.spec::text AS spec,"
                " 'tenants/' || t.name AS tenant FROM jobs j JOIN tenants t ON t.id = j.tenant_id"
                " WHERE j.id = ANY($1::uuid[])",
                {UuidArray(ids)}));
  for (const db::Row& row : rows) {
    Entry& entry = entries_[row.Get<std::string>("name")];
    v1::JobSpec stored;
    entry.loaded =
        google::protobuf::util::JsonStringToMessage(row.Get<std::string>("spec"), &stored).ok();
    entry.spec = WithDefaults(std::move(stored));  // stored as submitted
    entry.shape = PlacementShape(entry.spec);
    entry.tenant = row.Get<std::string>("tenant");
  }
  return absl::OkStatus();
}

absl::Status Scheduler::SetPendingReasons(
    const std::map<std::string, std::vector<std::string>>& reasons) {
  if (reasons.empty()) return absl::OkStatus();
  return pool_->Transact([&](db::Transaction& tx) -> absl::Status {
    GRADHUB_RETURN_IF_ERROR(LockAsLeader(tx));
    for (const auto& [why, ids] : reasons) {
      // A job placed or cancelled since the snapshot keeps the state_reason it has now.
      GRADHUB_RETURN_IF_ERROR(
          tx.Exec("UPDATE jobs SET state_reason = $1 WHERE id = ANY($2::uuid[])"
                  " AND state IN ('PENDING', 'RESTARTING') AND state_reason <> $1",
                  {why, UuidArray(ids)})
              .status());
    }
    return absl::OkStatus();
  });
}

void Scheduler::Start() {
  start_time_ = absl::Now();
  loop_ = std::thread([this] {
    PassLog log;
    std::unique_lock<std::mutex> lock(mu_);
    while (!stopping_) {
      // What the pass will see needs no fast path, and its verdicts are fresh.
      told_.nudged = false;
      told_.capacity_changed = false;
      told_.new_jobs.clear();
      lock.unlock();
      const auto started = std::chrono::steady_clock::now();
      const absl::Time pass_start = absl::Now();
      log.Report(RunOnce());
      // A pass that met an unreachable database spent its time waiting for an answer, not
      // loading the database: spaced by it, the first pass after the outage would come up to
      // nine silence timeouts late.
      const auto took = pool_->last_unreachable() >= pass_start
                            ? std::chrono::steady_clock::duration::zero()
                            : std::chrono::steady_clock::now() - started;
      lock.lock();
      // A pass reads the whole queue. However long it grows, passes take at most a tenth of
      // the time (and of a database connection): the next waits nine times as long as this
      // one took, even when nudged. With a quarter, a 20,000-job queue's passes (100 ms of
      // database CPU each) took enough of a 2-core host to put CreateJob's p99 at 1,000/s
      // from 7 ms to 15-23 ms (tests/bench/create_jobs); a short queue's pass takes a few
      // milliseconds, so its jobs are still placed within the interval. Meanwhile new jobs
      // take the fast path, which reads only them.
      const auto now = std::chrono::steady_clock::now();
      WaitPlacingNewJobs(lock, now + kPassSpacing * took, /*nudgeable=*/false);
      WaitPlacingNewJobs(lock, now + absl::ToChronoNanoseconds(options_.interval),
                         /*nudgeable=*/true);
    }
  });
}

// The fast path's rule: a job created since the last pass may be placed before the next one
// when that pass's verdict on every job ahead of it still holds. Nothing ahead of it closed
// the queue (verdict_.blocking), and no capacity was freed since (told_.capacity_changed: any
// Nudge), so every job ahead that did not fit then still does not fit now, and the pass would have
// placed the new job the same way, as backfill within the window.
void Scheduler::WaitPlacingNewJobs(std::unique_lock<std::mutex>& lock,
                                   std::chrono::steady_clock::time_point until, bool nudgeable) {
  while (!stopping_) {
    wake_.wait_until(lock, until, [&] {
      return stopping_ || (nudgeable && told_.nudged) ||
             (!told_.new_jobs.empty() && !told_.capacity_changed);
    });
    if (stopping_ || (nudgeable && told_.nudged) || std::chrono::steady_clock::now() >= until)
      return;
    std::vector<std::string> jobs;
    jobs.swap(told_.new_jobs);
    lock.unlock();
    if (absl::Status status = PlaceNewJobs(jobs); !status.ok()) {
      std::cerr << "gradhub-api: scheduler: fast path: " << status << "\n";
    }
    lock.lock();
  }
}

void Scheduler::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (loop_.joinable()) loop_.join();
}

void Scheduler::Nudge() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    told_.nudged = true;
    told_.capacity_changed = true;
    told_.queue_changed = true;
  }
  wake_.notify_all();
}

void Scheduler::JobSubmitted(const v1::Job& job, const v1::JobSpec& spec) {
  queued_specs_.Offer(job.name(), spec, job.tenant());
  // Stored with its reason (ReasonForNewJob): the light pass has nothing to do for it. Its
  // look for such jobs by id was the largest item of PostgreSQL's time after the inserts.
  TellNewJob(job.name(), /*judged=*/!job.state_reason().empty());
}

void Scheduler::JobCreated(const std::string& name) { TellNewJob(name, /*judged=*/false); }

void Scheduler::TellNewJob(const std::string& name, bool judged) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    told_.new_jobs.push_back(name);
    if (!judged) told_.unjudged.push_back(name);
    // A pass that may place it runs now (a short queue's pass is as quick as the fast path, and
    // sets reasons). While the last pass found no node free, the next pass at its interval
    // gives it its reason: the light pass, cheap, but with the fixed costs of a pass.
    told_.nudged = told_.nudged || node_was_free_;
  }
  wake_.notify_all();
}

}  // namespace gradhub::api
