#include "services/api/scheduler.h"

#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "services/api/attempts.h"
#include "services/api/job_records.h"
#include "services/common/contract/data_paths.h"
#include "services/common/contract/job_spec.h"
#include "services/common/status_macros.h"

namespace gradhub::api {
namespace {

// pg_advisory_xact_lock key of the scheduler: "gradhub" "sched" in ASCII, arbitrary but fixed.
constexpr int64_t kSchedulerLock = 0x6772616468756273;

constexpr char kLiveRankStates[] = "('ASSIGNED', 'STARTING', 'RUNNING', 'STOPPING')";

absl::Status TakeSchedulerLock(db::Transaction& tx) {
  return tx.Exec("SELECT pg_advisory_xact_lock($1)", {kSchedulerLock}).status();
}

double Seconds(absl::Duration d) { return absl::ToDoubleSeconds(d); }

// The idle time after a pass, as a multiple of the time the pass took (see Start).
constexpr int kPassSpacing = 9;

// Capacity of one node as the placement sees it.
struct NodeCapacity {
  int64_t id = 0;
  std::string name;
  bool schedulable = false;  // READY, heartbeating, of the device kind the job needs
  bool labels_match = false;
  bool roots_match = false;  // its data roots hold every path the job names
  std::vector<int32_t> free_slots;
};

struct RankPlacement {
  int32_t rank, local_rank, slot;
  const NodeCapacity* node;
};

// Packs ranks onto as few nodes as possible: nodes with the most free slots first (rank 0 on
// the first), at most ranks_per_node on each. Empty when they do not all fit; then *why says
// what is missing.
std::vector<RankPlacement> Pack(const std::vector<NodeCapacity>& nodes, int32_t world_size,
                                int32_t ranks_per_node,
                                const google::protobuf::Map<std::string, std::string>& selector,
                                std::string* why) {
  std::vector<const NodeCapacity*> eligible;
  bool any_labelled = false;
  bool any_serves = false;
  for (const NodeCapacity& node : nodes) {
    any_labelled |= node.labels_match;
    any_serves |= node.labels_match && node.roots_match;
    if (node.schedulable && node.labels_match && node.roots_match && !node.free_slots.empty()) {
      eligible.push_back(&node);
    }
  }
  std::stable_sort(eligible.begin(), eligible.end(), [](const auto* a, const auto* b) {
    return a->free_slots.size() > b->free_slots.size();
  });
  const size_t per_node = ranks_per_node > 0 ? static_cast<size_t>(ranks_per_node) : SIZE_MAX;
  std::vector<RankPlacement> placed;
  int32_t free_total = 0;
  for (const NodeCapacity* node : eligible) {
    const size_t take = std::min(
        {node->free_slots.size(), per_node, static_cast<size_t>(world_size) - placed.size()});
    free_total += static_cast<int32_t>(std::min(node->free_slots.size(), per_node));
    for (size_t i = 0; i < take; ++i) {
      placed.push_back({static_cast<int32_t>(placed.size()), static_cast<int32_t>(i),
                        node->free_slots[i], node});
    }
  }
  if (placed.size() == static_cast<size_t>(world_size)) return placed;
  if (!selector.empty() && !any_labelled) {
    std::vector<std::string> wanted;
    for (const auto& [key, value] : selector) wanted.push_back(key + "=" + value);
    std::sort(wanted.begin(), wanted.end());
    *why = absl::StrCat("no node with label ", absl::StrJoin(wanted, ","));
  } else if (!any_serves) {
    *why = "no node's data roots hold every file the spec names (see each node's dataRoots)";
  } else if (eligible.empty()) {
    *why = absl::StrCat("needs ", world_size, " slots, no ready node has a free slot");
  } else {
    *why = absl::StrCat(
        "needs ", world_size, " slots",
        ranks_per_node > 0 ? absl::StrCat(" (at most ", ranks_per_node, " per node)") : "", ", ",
        free_total, " usable on ", eligible.size(), " ready nodes, ",
        eligible.front()->free_slots.size(), " free on the largest node");
  }
  return {};
}

// A node as the scheduler sees it, before any job's needs are applied.
struct NodeRecord {
  int64_t id = 0;
  std::string name;
  bool ready = false;  // READY and heartbeating
  std::string device_kind;
  nlohmann::json labels;
  std::vector<std::string> data_roots;
  std::vector<int32_t> free_slots;
};

absl::StatusOr<std::vector<NodeRecord>> ReadNodes(db::Transaction& tx, absl::Duration lease) {
  GRADHUB_ASSIGN_OR_RETURN(
      db::Result rows,
      tx.Exec(
          absl::StrCat(
              "SELECT n.id, n.name, n.slots, n.device_kind, n.labels::text AS labels,"
              " n.data_roots::text AS data_roots,"
              " (n.state = 'READY' AND n.last_heartbeat_time > now() - $1 * interval '1 second')"
              "   AS ready,"
              " (SELECT coalesce(string_agg(a.slot::text, ','), '') FROM rank_assignments a"
              "   WHERE a.node_id = n.id AND a.state IN ",
              kLiveRankStates,
              ") AS used"
              " FROM nodes n WHERE n.state <> 'LOST' ORDER BY n.name"),
          {Seconds(lease)}));
  std::vector<NodeRecord> nodes;
  for (const db::Row& row : rows) {
    NodeRecord node;
    node.id = row.Get<int64_t>("id");
    node.name = row.Get<std::string>("name");
    node.ready = row.Get<bool>("ready");
    node.device_kind = row.Get<std::string>("device_kind");
    node.labels = nlohmann::json::parse(row.Get<std::string>("labels"));
    for (const auto& root : nlohmann::json::parse(row.Get<std::string>("data_roots"))) {
      node.data_roots.push_back(root.get<std::string>());
    }
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

std::vector<NodeCapacity> CapacityFor(const std::vector<NodeRecord>& records,
                                      const v1::JobSpec& spec) {
  const bool needs_cuda = spec.distributed().backend() == v1::DistributedSpec::NCCL;
  std::vector<NodeCapacity> nodes;
  for (const NodeRecord& record : records) {
    NodeCapacity node;
    node.id = record.id;
    node.name = record.name;
    node.schedulable = record.ready && (!needs_cuda || record.device_kind == "CUDA");
    node.labels_match = true;
    node.roots_match = RootsServeSpec(record.data_roots, spec);
    for (const auto& [key, value] : spec.node_selector()) {
      node.labels_match &= record.labels.contains(key) && record.labels[key] == value;
    }
    node.free_slots = record.free_slots;
    nodes.push_back(std::move(node));
  }
  return nodes;
}

// The rows of the queue in the order the scheduler serves it: priority (highest first), then
// submission time, then job id (as the text of canonical uuids sorts, like the uuids).
std::vector<int> QueueOrder(const db::Result& queue) {
  struct Key {
    int32_t priority;
    int64_t create_us;
    std::string name;
    int row;
  };
  std::vector<Key> keys;
  keys.reserve(static_cast<size_t>(queue.rows()));
  for (int i = 0; i < queue.rows(); ++i) {
    const db::Row row = queue.row(i);
    keys.push_back({row.Get<int32_t>("priority"), row.Get<int64_t>("create_us"),
                    row.Get<std::string>("name"), i});
  }
  std::sort(keys.begin(), keys.end(), [](const Key& a, const Key& b) {
    if (a.priority != b.priority) return a.priority > b.priority;
    if (a.create_us != b.create_us) return a.create_us < b.create_us;
    return a.name < b.name;
  });
  std::vector<int> order;
  order.reserve(keys.size());
  for (const Key& key : keys) order.push_back(key.row);
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
absl::Status CreateAttempt(db::Transaction& tx, v1::Job job,
                           const std::vector<RankPlacement>& placement) {
  const std::string id = JobId(job.name());
  const int32_t attempt = job.attempt() + 1;
  GRADHUB_RETURN_IF_ERROR(
      tx.Exec("INSERT INTO job_attempts (job_id, attempt, rendezvous_prefix)"
              " VALUES ($1::uuid, $2, $3)",
              {id, attempt, absl::StrCat("jobs/", id, "/attempts/", attempt, "/")})
          .status());
  GRADHUB_RETURN_IF_ERROR(
      tx.Exec("UPDATE jobs SET current_attempt = $2 WHERE id = $1::uuid", {id, attempt}).status());
  std::map<std::string, std::vector<int32_t>> ranks_by_node;
  std::vector<std::string> node_order;
  for (const RankPlacement& rank : placement) {
    GRADHUB_RETURN_IF_ERROR(
        tx.Exec("INSERT INTO rank_assignments (job_id, attempt, rank, node_id, local_rank, slot)"
                " VALUES ($1::uuid, $2, $3, $4, $5, $6)",
                {id, attempt, rank.rank, rank.node->id, rank.local_rank, rank.slot})
            .status());
    if (!ranks_by_node.count(rank.node->name)) node_order.push_back(rank.node->name);
    ranks_by_node[rank.node->name].push_back(rank.rank);
  }
  std::vector<std::string> where;
  for (const std::string& node : node_order) {
    const auto& ranks = ranks_by_node[node];
    where.push_back(absl::StrCat("nodes/", node, " (rank", ranks.size() > 1 ? "s " : " ",
                                 ranks.front(),
                                 ranks.size() > 1 ? absl::StrCat("-", ranks.back()) : "", ")"));
  }
  job.set_attempt(attempt);
  return ApplyTransition(
             tx, job, v1::Job::SCHEDULED,
             Because(absl::StrCat("attempt ", attempt, " placed on ", absl::StrJoin(where, ", "))))
      .status();
}

struct RankRow {
  int32_t rank;
  std::string state, node, message;
  int32_t exit_code, signal;
  double age_seconds;  // since its state last changed
};

}  // namespace

bool MayDeclareNodesLost(absl::Duration api_uptime, absl::Duration startup_grace) {
  return api_uptime >= startup_grace;
}

std::string NodeLostReason(const std::string& node, double silent_seconds, absl::Duration lease) {
  return absl::StrCat("nodes/", node, " lost: no heartbeat for ",
                      static_cast<int64_t>(silent_seconds), " s (lease ",
                      absl::FormatDuration(lease), ")");
}

absl::Status Scheduler::RunOnce() {
  std::lock_guard<std::mutex> one_pass_at_a_time(pass_mu_);
  GRADHUB_RETURN_IF_ERROR(SweepNodes());
  GRADHUB_RETURN_IF_ERROR(ReconcileAttempts());
  GRADHUB_RETURN_IF_ERROR(FinishCancellations());
  return PlaceJobs();
}

absl::Status Scheduler::SweepNodes() {
  // Protocol step 2 (scheduler.h): right after this api started, a node's last heartbeat may
  // be older than the lease only because no api was there to take it. Its agent keeps its
  // ranks running (up to its --api-outage-grace) and reconnects within a few seconds; until
  // startup_grace has passed, silence proves nothing.
  const bool may_lose = MayDeclareNodesLost(absl::Now() - start_time_, options_.startup_grace);
  return pool_->Transact([&](db::Transaction& tx) -> absl::Status {
    GRADHUB_RETURN_IF_ERROR(TakeSchedulerLock(tx));
    GRADHUB_ASSIGN_OR_RETURN(
        db::Result lost,
        // A node that has heartbeated to this api since it started needs no grace: its silence
        // is its own. (Compares the api's clock with the database's: they must agree to well
        // under a lease, as NTP keeps them.)
        tx.Exec("UPDATE nodes SET state = 'LOST', session_id = NULL WHERE state <> 'LOST'"
                " AND last_heartbeat_time < now() - $1 * interval '1 second'"
                " AND ($2 OR last_heartbeat_time > to_timestamp($3))"
                " RETURNING id, name,"
                " extract(epoch FROM now() - last_heartbeat_time)::float8 AS silent_s",
                {Seconds(options_.node_lease), may_lose,
                 absl::ToDoubleSeconds(start_time_ - absl::UnixEpoch())}));
    for (const db::Row& row : lost) {
      const std::string name = row.Get<std::string>("name");
      GRADHUB_RETURN_IF_ERROR(ForgetRanksOnNode(
          tx, row.Get<int64_t>("id"), name,
          NodeLostReason(name, row.Get<double>("silent_s"), options_.node_lease)));
    }
    // Draining: restart the jobs that still run there; cordon once nothing is left.
    GRADHUB_ASSIGN_OR_RETURN(
        db::Result draining,
        tx.Exec(
            absl::StrCat("SELECT DISTINCT n.id, n.name, a.job_id::text AS job_id, a.attempt, a.rank"
                         " FROM nodes n LEFT JOIN rank_assignments a ON a.node_id = n.id"
                         " AND a.state IN ",
                         kLiveRankStates,
                         " WHERE n.state = 'DRAINING'"
                         " ORDER BY n.id, a.rank")));
    std::set<int64_t> busy;
    std::set<std::string> failed_jobs;
    for (const db::Row& row : draining) {
      if (row.IsNull("job_id")) continue;
      busy.insert(row.Get<int64_t>("id"));
      const std::string job_id = row.Get<std::string>("job_id");
      if (!failed_jobs.insert(job_id).second) continue;
      GRADHUB_ASSIGN_OR_RETURN(v1::Job job, ReadJob(tx, "jobs/" + job_id, -1, true));
      if (job.attempt() != row.Get<int32_t>("attempt")) continue;
      AttemptFailure failure;
      failure.event = v1::JobEvent::NODE_LOST;
      failure.kind = v1::JobEvent::INFRASTRUCTURE;
      failure.details.node = "nodes/" + row.Get<std::string>("name");
      failure.details.rank = row.Get<int32_t>("rank");
      failure.details.message = failure.details.node + " is being drained";
      GRADHUB_RETURN_IF_ERROR(FailAttempt(tx, job, failure));
    }
    for (const db::Row& row : draining) {
      if (busy.count(row.Get<int64_t>("id"))) continue;
      GRADHUB_RETURN_IF_ERROR(tx.Exec("UPDATE nodes SET state = 'CORDONED' WHERE id = $1"
                                      " AND state = 'DRAINING'",
                                      {row.Get<int64_t>("id")})
                                  .status());
    }
    return absl::OkStatus();
  });
}

absl::Status Scheduler::ReconcileAttempts() {
  GRADHUB_ASSIGN_OR_RETURN(
      db::Result active,
      pool_->Exec("SELECT job_id::text AS job_id, attempt FROM job_attempts"
                  " WHERE state IN ('SCHEDULED', 'RUNNING') ORDER BY create_time"));
  for (const db::Row& entry : active) {
    const std::string name = "jobs/" + entry.Get<std::string>("job_id");
    const int32_t attempt = entry.Get<int32_t>("attempt");
    std::optional<double> queued_seconds;  // set when this pass makes the job RUNNING
    absl::Status status = pool_->Transact([&](db::Transaction& tx) -> absl::Status {
      queued_seconds.reset();  // a retried transaction starts over
      GRADHUB_RETURN_IF_ERROR(TakeSchedulerLock(tx));
      GRADHUB_ASSIGN_OR_RETURN(v1::Job job, ReadJob(tx, name, -1, true));
      const std::string id = JobId(name);
      GRADHUB_ASSIGN_OR_RETURN(
          db::Result attempt_row,
          tx.Exec("SELECT state, extract(epoch FROM now() - greatest(create_time,"
                  " coalesce(start_time, create_time)))::float8 AS idle_s"
                  " FROM job_attempts WHERE job_id = $1::uuid AND attempt = $2",
                  {id, attempt}));
      if (attempt_row.empty()) return absl::OkStatus();
      const std::string attempt_state = attempt_row.row(0).Get<std::string>("state");
      if (attempt_state != "SCHEDULED" && attempt_state != "RUNNING") return absl::OkStatus();
      // A job that ended (cancelled) or moved on takes its attempt with it.
      if (job.attempt() != attempt || IsTerminal(job.state()) ||
          job.state() == v1::Job::CANCELLING) {
        const bool cancelled =
            job.state() == v1::Job::CANCELLED || job.state() == v1::Job::CANCELLING;
        const std::string ended = cancelled                           ? "CANCELLED"
                                  : job.state() == v1::Job::SUCCEEDED ? "SUCCEEDED"
                                                                      : "FAILED";
        GRADHUB_RETURN_IF_ERROR(tx.Exec("UPDATE job_attempts SET state = $3, end_time = now()"
                                        " WHERE job_id = $1::uuid AND attempt = $2",
                                        {id, attempt, ended})
                                    .status());
        return tx
            .Exec(
                "UPDATE rank_assignments SET state = 'STOPPING', update_time = now()"
                " WHERE job_id = $1::uuid AND attempt = $2"
                " AND state IN ('ASSIGNED', 'STARTING', 'RUNNING')",
                {id, attempt})
            .status();
      }
      GRADHUB_ASSIGN_OR_RETURN(
          db::Result rank_rows,
          tx.Exec("SELECT a.rank, a.state, n.name AS node, a.message,"
                  " coalesce(a.exit_code, 0) AS exit_code, coalesce(a.signal, 0) AS signal,"
                  " extract(epoch FROM now() - a.update_time)::float8 AS age_s,"
                  " extract(epoch FROM now() - a.last_step_time)::float8 AS step_age_s"
                  " FROM rank_assignments a JOIN nodes n ON n.id = a.node_id"
                  " WHERE a.job_id = $1::uuid AND a.attempt = $2 ORDER BY a.update_time, a.rank",
                  {id, attempt}));
      std::vector<RankRow> ranks;
      int started = 0, succeeded = 0;
      std::optional<double> newest_step_age;
      for (const db::Row& row : rank_rows) {
        ranks.push_back({row.Get<int32_t>("rank"), row.Get<std::string>("state"),
                         row.Get<std::string>("node"), row.Get<std::string>("message"),
                         row.Get<int32_t>("exit_code"), row.Get<int32_t>("signal"),
                         row.Get<double>("age_s")});
        const std::string& state = ranks.back().state;
        started += state == "STARTING" || state == "RUNNING" || state == "SUCCEEDED";
        succeeded += state == "SUCCEEDED";
        if (!row.IsNull("step_age_s")) {
          const double age = row.Get<double>("step_age_s");
          newest_step_age = newest_step_age ? std::min(*newest_step_age, age) : age;
        }
      }

      // A failed rank: blame the first one that did not merely lose its peers, or, once the
      // grace has passed without one, the first that did.
      const RankRow* culprit = nullptr;
      const RankRow* peer_loss = nullptr;
      for (const RankRow& rank : ranks) {
        if (rank.state != "FAILED" && rank.state != "STOPPED") continue;
        const auto kind = rank.state == "STOPPED" ? v1::JobEvent::INFRASTRUCTURE
                                                  : FailureKindOfExit(rank.exit_code, rank.signal);
        if (kind != v1::JobEvent::INFRASTRUCTURE) {
          culprit = &rank;
          break;
        }
        // Of the infrastructure failures, one its agent stopped says why (lost node, an api
        // outage past the agent's grace); ranks that merely lost their peers say less.
        if (peer_loss == nullptr || (peer_loss->state != "STOPPED" && rank.state == "STOPPED")) {
          peer_loss = &rank;
        }
      }
      if (culprit == nullptr && peer_loss != nullptr &&
          (peer_loss->age_seconds >= Seconds(options_.peer_failure_grace) ||
           started - succeeded == 0)) {
        culprit = peer_loss;
      }
      if (culprit != nullptr) {
        AttemptFailure failure;
        failure.event = v1::JobEvent::RANK_FAILED;
        failure.kind = culprit->state == "STOPPED"
                           ? v1::JobEvent::INFRASTRUCTURE
                           : FailureKindOfExit(culprit->exit_code, culprit->signal);
        failure.details.rank = culprit->rank;
        failure.details.node = "nodes/" + culprit->node;
        failure.details.exit_code = culprit->exit_code;
        failure.details.signal = culprit->signal;
        failure.details.message =
            RankFailureMessage(culprit->rank, culprit->state == "STOPPED", culprit->exit_code,
                               culprit->signal, culprit->message);
        return FailAttempt(tx, job, failure);
      }
      if (job.state() == v1::Job::SCHEDULED && started == static_cast<int>(ranks.size())) {
        GRADHUB_ASSIGN_OR_RETURN(
            db::Result started_row,
            tx.Exec("UPDATE job_attempts SET state = 'RUNNING', start_time = now()"
                    " WHERE job_id = $1::uuid AND attempt = $2 RETURNING (SELECT"
                    " extract(epoch FROM now() - j.queued_time)::float8 FROM jobs j"
                    " WHERE j.id = $1::uuid) AS queued_s",
                    {id, attempt}));
        if (!started_row.empty()) queued_seconds = started_row.row(0).Get<double>("queued_s");
        GRADHUB_ASSIGN_OR_RETURN(
            job, ApplyTransition(tx, job, v1::Job::RUNNING,
                                 Because(absl::StrCat("all ", ranks.size(), " ranks started"))));
      }
      if (succeeded == static_cast<int>(ranks.size()) && job.state() == v1::Job::RUNNING) {
        GRADHUB_RETURN_IF_ERROR(tx.Exec("UPDATE job_attempts SET state = 'SUCCEEDED',"
                                        " end_time = now() WHERE job_id = $1::uuid"
                                        " AND attempt = $2",
                                        {id, attempt})
                                    .status());
        return ApplyTransition(tx, job, v1::Job::SUCCEEDED,
                               Because(absl::StrCat("all ", ranks.size(), " ranks exited 0")))
            .status();
      }
      // The watchdog: no step from any rank (or no start) for hang_timeout.
      // The stored spec is as submitted: its defaults apply here.
      const int32_t hang = WithDefaults(job.spec()).hang_timeout_seconds();
      const double idle = newest_step_age
                              ? std::min(*newest_step_age, attempt_row.row(0).Get<double>("idle_s"))
                              : attempt_row.row(0).Get<double>("idle_s");
      if (idle > hang) {
        AttemptFailure failure;
        failure.event = v1::JobEvent::HANG_DETECTED;
        failure.kind = v1::JobEvent::JOB;
        failure.details.message = absl::StrCat("no training step for ", static_cast<int64_t>(idle),
                                               " s (hang_timeout_seconds ", hang, ")");
        return FailAttempt(tx, job, failure);
      }
      return absl::OkStatus();
    });
    if (!status.ok()) {
      std::cerr << "gradhub-api: scheduler: " << name << " attempt " << attempt << ": " << status
                << "\n";
    } else if (queued_seconds && options_.on_running) {
      options_.on_running(absl::Seconds(*queued_seconds));
    }
  }
  return absl::OkStatus();
}

absl::Status Scheduler::FinishCancellations() {
  // Step 3: CANCELLING lasts while any rank of the job is live (not yet reported gone by its
  // agent, nor forgotten with a lost node); then the job is CANCELLED.
  GRADHUB_ASSIGN_OR_RETURN(
      db::Result done,
      pool_->Exec("SELECT 'jobs/' || j.id::text AS name FROM jobs j WHERE j.state = 'CANCELLING'"
                  " AND NOT EXISTS (SELECT 1 FROM rank_assignments a WHERE a.job_id = j.id"
                  "   AND a.state IN ('ASSIGNED', 'STARTING', 'RUNNING', 'STOPPING'))"));
  for (const db::Row& row : done) {
    const std::string name = row.Get<std::string>("name");
    absl::Status status = pool_->Transact([&](db::Transaction& tx) -> absl::Status {
      GRADHUB_RETURN_IF_ERROR(TakeSchedulerLock(tx));
      GRADHUB_ASSIGN_OR_RETURN(v1::Job job, ReadJob(tx, name, -1, true));
      if (job.state() != v1::Job::CANCELLING) return absl::OkStatus();
      GRADHUB_ASSIGN_OR_RETURN(
          db::Result live, tx.Exec("SELECT 1 FROM rank_assignments WHERE job_id = $1::uuid"
                                   " AND state IN ('ASSIGNED', 'STARTING', 'RUNNING', 'STOPPING')"
                                   " LIMIT 1",
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

absl::Status Scheduler::PlaceJobs() {
  // The queue and the nodes are read once per pass without locks. A job that cannot be placed
  // in that snapshot and already says why is left alone: taking its row lock would make every
  // waiting job a durable commit on every pass. A placement, or a new reason, is decided again
  // in a transaction under the scheduler lock from what it reads there.
  // Of each job only what placement reads, in no order: PostgreSQL's sort of a long queue
  // cost more than its scan (and spilled to disk past work_mem once the table had statistics),
  // while QueueOrder takes a few milliseconds. One backend: a parallel scan would take every
  // core of a small database host while it lasts, and CreateJob's latency with them.
  GRADHUB_ASSIGN_OR_RETURN(
      db::Result queue,
      pool_->Transact(
          [&](db::Transaction& tx) -> absl::StatusOr<db::Result> {
            GRADHUB_RETURN_IF_ERROR(
                tx.Exec("SET LOCAL max_parallel_workers_per_gather = 0").status());
            return tx.Exec(
                absl::StrCat("SELECT 'jobs/' || j.id::text AS name, j.priority,"
                             " (extract(epoch FROM j.create_time) * 1e6)::bigint AS create_us,"
                             " j.state_reason, j.current_attempt,"
                             " extract(epoch FROM now() - j.queued_time)::float8 AS waited_s,"
                             " j.state = 'RESTARTING' AND EXISTS (SELECT 1 FROM rank_assignments a"
                             "   WHERE a.job_id = j.id AND a.state IN ",
                             kLiveRankStates,
                             ") AS stopping"
                             " FROM jobs j WHERE j.state IN ('PENDING', 'RESTARTING')"));
          },
          {.read_only = true}));
  GRADHUB_ASSIGN_OR_RETURN(const std::vector<const PlacementSpec*> specs,
                           ReadPlacementSpecs(queue));
  GRADHUB_ASSIGN_OR_RETURN(
      const std::vector<NodeRecord> snapshot,
      pool_->Transact([&](db::Transaction& tx) { return ReadNodes(tx, options_.node_lease); },
                      {.read_only = true}));

  std::optional<std::string> blocked_by;  // the first job that did not fit, once past its window
  // Where `job` goes on `nodes`, or why it waits (then `blocked` may be set).
  struct Decision {
    std::vector<NodeCapacity> capacity;  // what `placement` points into
    std::vector<RankPlacement> placement;
    std::string why;
  };
  // Within the pass the snapshot stays as read, so a job shape that did not fit it will not
  // fit for the next job of that shape either, and a long queue is mostly a few shapes.
  std::unordered_map<std::string_view, std::string> unfit_in_snapshot;  // shape -> why
  // `shape` is given only for a decision against the snapshot.
  auto decide = [&](const std::string& name, int32_t attempt, const v1::JobSpec& spec,
                    const std::string* shape, const std::vector<NodeRecord>& nodes, bool stopping,
                    double waited, std::optional<std::string>& blocked) {
    Decision decision;
    const auto unfit = shape == nullptr ? unfit_in_snapshot.end() : unfit_in_snapshot.find(*shape);
    if (stopping) {
      decision.why = absl::StrCat("waiting for the ranks of attempt ", attempt, " to stop");
    } else if (blocked) {
      decision.why =
          absl::StrCat("waiting behind ", *blocked,
                       ", which comes first and has waited longer than the backfill window (",
                       absl::FormatDuration(options_.backfill_window), ")");
    } else {
      if (unfit != unfit_in_snapshot.end()) {
        decision.why = unfit->second;
      } else {
        decision.capacity = CapacityFor(nodes, spec);
        decision.placement =
            Pack(decision.capacity, spec.distributed().world_size(),
                 spec.distributed().ranks_per_node(), spec.node_selector(), &decision.why);
        if (decision.placement.empty() && shape != nullptr) {
          unfit_in_snapshot.emplace(*shape, decision.why);
        }
      }
      if (decision.placement.empty() && waited >= Seconds(options_.backfill_window)) {
        blocked = name;
      }
    }
    return decision;
  };

  // Reasons are written together at the end of the pass, one statement per distinct reason:
  // a burst of submissions to a full cluster would otherwise cost one more durable commit per
  // new job. They are only advice to the user, so the snapshot is good enough for them; a
  // placement is still decided under the lock.
  std::map<std::string, std::vector<std::string>> new_reasons;  // why -> job ids
  for (const int i : QueueOrder(queue)) {
    if (stopping_) break;  // SIGTERM: the next api picks the queue up where this one left it
    const db::Row entry = queue.row(i);
    const std::string name = entry.Get<std::string>("name");
    const bool stopping = entry.Get<bool>("stopping");
    const double waited = entry.Get<double>("waited_s");
    // Unreadable (not cached) means decided in the transaction, from the whole stored job.
    if (const PlacementSpec* cached = specs[static_cast<size_t>(i)]; cached != nullptr) {
      std::optional<std::string> blocked_in_snapshot = blocked_by;
      const Decision guess =
          decide(name, entry.Get<int32_t>("current_attempt"), cached->spec, &cached->shape,
                 snapshot, stopping, waited, blocked_in_snapshot);
      if (guess.placement.empty()) {
        blocked_by = blocked_in_snapshot;
        if (guess.why != entry.Get<std::string>("state_reason")) {
          new_reasons[guess.why].push_back(JobId(name));
        }
        continue;
      }
    }
    absl::Status status = pool_->Transact([&](db::Transaction& tx) -> absl::Status {
      GRADHUB_RETURN_IF_ERROR(TakeSchedulerLock(tx));
      GRADHUB_ASSIGN_OR_RETURN(v1::Job job, ReadJob(tx, name, -1, true));
      if (job.state() != v1::Job::PENDING && job.state() != v1::Job::RESTARTING) {
        return absl::OkStatus();
      }
      GRADHUB_ASSIGN_OR_RETURN(std::vector<NodeRecord> nodes, ReadNodes(tx, options_.node_lease));
      const Decision decision = decide(job.name(), job.attempt(), WithDefaults(job.spec()), nullptr,
                                       nodes, stopping, waited, blocked_by);
      if (decision.placement.empty()) return SetPendingReason(tx, job, decision.why);
      return CreateAttempt(tx, job, decision.placement);
    });
    if (!status.ok()) {
      std::cerr << "gradhub-api: scheduler: placing " << name << ": " << status << "\n";
    }
  }
  return SetPendingReasons(new_reasons);
}

absl::StatusOr<std::vector<const Scheduler::PlacementSpec*>> Scheduler::ReadPlacementSpecs(
    const db::Result& queue) {
  const uint64_t pass = ++passes_;
  std::vector<PlacementSpec*> specs;
  specs.reserve(static_cast<size_t>(queue.rows()));
  std::vector<std::string> missing;  // job ids
  for (const db::Row& entry : queue) {
    auto [it, added] = placement_specs_.try_emplace(entry.Get<std::string>("name"));
    it->second.seen_in_pass = pass;
    if (!it->second.loaded) missing.push_back(JobId(it->first));
    specs.push_back(&it->second);
  }
  for (auto it = placement_specs_.begin(); it != placement_specs_.end();) {
    it = it->second.seen_in_pass == pass ? std::next(it) : placement_specs_.erase(it);
  }
  if (!missing.empty()) {
    GRADHUB_ASSIGN_OR_RETURN(
        db::Result rows,
        pool_->Exec("SELECT 'jobs/' || j.id::text AS name,"
                    " jsonb_build_object('distributed', j.spec -> 'distributed',"
                    "   'nodeSelector', coalesce(j.spec -> 'nodeSelector', '{}'),"
                    // The files it names decide which nodes' data roots can serve it.
                    "   'dataset', coalesce(j.spec -> 'dataset', '{}'),"
                    "   'model', coalesce(j.spec -> 'model', '{}'))::text AS spec"
                    " FROM jobs j WHERE j.id = ANY($1::uuid[])",
                    {UuidArray(missing)}));
    for (const db::Row& row : rows) {
      PlacementSpec& cached = placement_specs_[row.Get<std::string>("name")];
      cached.shape = row.Get<std::string>("spec");
      cached.loaded = google::protobuf::util::JsonStringToMessage(cached.shape, &cached.spec).ok();
      cached.spec = WithDefaults(std::move(cached.spec));  // stored as submitted
    }
  }
  std::vector<const PlacementSpec*> loaded;
  loaded.reserve(specs.size());
  for (const PlacementSpec* spec : specs) loaded.push_back(spec->loaded ? spec : nullptr);
  return loaded;
}

absl::Status Scheduler::SetPendingReasons(
    const std::map<std::string, std::vector<std::string>>& reasons) {
  if (reasons.empty()) return absl::OkStatus();
  return pool_->Transact([&](db::Transaction& tx) -> absl::Status {
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
    std::unique_lock<std::mutex> lock(mu_);
    while (!stopping_) {
      lock.unlock();
      const auto started = std::chrono::steady_clock::now();
      if (absl::Status status = RunOnce(); !status.ok()) {
        std::cerr << "gradhub-api: scheduler pass failed: " << status << "\n";
      }
      const auto took = std::chrono::steady_clock::now() - started;
      lock.lock();
      // A pass reads the whole queue. However long it grows, passes take at most a tenth of
      // the time (and of a database connection): the next waits nine times as long as this
      // one took, even when nudged. With a quarter, a 20,000-job queue's passes (100 ms of
      // database CPU each) took enough of a 2-core host to put CreateJob's p99 at 1,000/s
      // from 7 ms to 15-23 ms (tests/bench/create_jobs); a short queue's pass takes a few
      // milliseconds, so its jobs are still placed within the interval.
      wake_.wait_for(lock, kPassSpacing * took, [this] { return stopping_.load(); });
      wake_.wait_for(lock, absl::ToChronoNanoseconds(options_.interval) - kPassSpacing * took,
                     [this] { return stopping_ || nudged_; });
      nudged_ = false;
    }
  });
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
    nudged_ = true;
  }
  wake_.notify_all();
}

}  // namespace gradhub::api
