#include "services/api/node_manager.h"

#include <google/protobuf/util/json_util.h>
#include <google/protobuf/util/time_util.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <set>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "services/api/attempts.h"
#include "services/api/job_metrics.h"
#include "services/api/scheduling_rules.h"
#include "services/api/trainer_events.h"
#include "services/common/contract/data_paths.h"
#include "services/common/contract/job_states.h"
#include "services/common/job_records.h"
#include "services/common/page_token.h"
#include "services/common/status_macros.h"

namespace gradhub::api {
namespace {

using google::protobuf::util::TimeUtil;
using RankKey = std::tuple<std::string, int32_t, int32_t>;  // job id, attempt, rank

const std::string kNodeColumns = absl::StrCat(
    "n.id, n.name, n.state, n.device_kind, n.slots, n.labels::text AS labels, n.address,"
    " n.agent_version, n.data_roots::text AS data_roots, n.devices::text AS devices,"
    " n.master_port_base, n.memory_per_slot_bytes,"
    " n.tenant_data_roots::text AS tenant_data_roots,"
    " coalesce(n.session_id::text, '') AS session_id, n.last_heartbeat_seq,"
    " (extract(epoch FROM n.last_heartbeat_time) * 1e6)::bigint AS heartbeat_us,"
    " (SELECT count(*) FROM rank_assignments a WHERE a.node_id = n.id"
    "   AND a.state IN ",
    kLiveRankStatesSql, ")::int AS slots_in_use");

constexpr int32_t kMaxSlots = 4096;

absl::Status NodeNotFound(const std::string& name) {
  return absl::NotFoundError(absl::StrCat("node '", name, "' not found"));
}

std::string LabelsJson(const google::protobuf::Map<std::string, std::string>& labels) {
  nlohmann::json json = nlohmann::json::object();
  for (const auto& [key, value] : labels) json[key] = value;
  return json.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string RootsJson(const google::protobuf::RepeatedPtrField<std::string>& roots) {
  nlohmann::json json = nlohmann::json::array();
  for (const std::string& root : roots) json.push_back(root);
  return json.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// Node.tenant_data_roots as stored: a JSON array of {"tenant": "tenants/x", "path": "/dir"}.
std::string TenantRootsJson(const google::protobuf::RepeatedPtrField<v1::TenantDataRoot>& roots) {
  nlohmann::json json = nlohmann::json::array();
  for (const v1::TenantDataRoot& root : roots) {
    json.push_back({{"tenant", root.tenant()}, {"path", root.path()}});
  }
  return json.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// The node's GPUs as a JSON array of DeviceInfo in the proto3 JSON mapping, so that a field
// added to DeviceInfo is stored without a migration.
std::string DevicesJson(const google::protobuf::RepeatedPtrField<v1::DeviceInfo>& devices) {
  nlohmann::json json = nlohmann::json::array();
  for (const v1::DeviceInfo& device : devices) {
    std::string text;
    if (google::protobuf::util::MessageToJsonString(device, &text).ok()) {
      json.push_back(nlohmann::json::parse(text));
    }
  }
  return json.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// The state column of a nodes row.
v1::Node::State NodeStateOf(const db::Row& row) {
  v1::Node::State state = v1::Node::STATE_UNSPECIFIED;
  v1::Node::State_Parse(row.Get<std::string>("state"), &state);
  return state;
}

v1::Node NodeFromRow(const db::Row& row) {
  v1::Node node;
  node.set_name("nodes/" + row.Get<std::string>("name"));
  node.set_kind(row.Get<std::string>("device_kind") == "CUDA" ? v1::Node::CUDA : v1::Node::CPU);
  node.set_slots(row.Get<int32_t>("slots"));
  // Named: a range-for over parse(...).items() would iterate a destroyed temporary.
  const nlohmann::json labels = nlohmann::json::parse(row.Get<std::string>("labels"));
  for (const auto& [key, value] : labels.items()) {
    (*node.mutable_labels())[key] = value.get<std::string>();
  }
  node.set_address(row.Get<std::string>("address"));
  node.set_agent_version(row.Get<std::string>("agent_version"));
  node.set_master_port_base(row.Get<int32_t>("master_port_base"));
  const nlohmann::json roots = nlohmann::json::parse(row.Get<std::string>("data_roots"));
  for (const auto& root : roots) node.add_data_roots(root.get<std::string>());
  const nlohmann::json tenant_roots =
      nlohmann::json::parse(row.Get<std::string>("tenant_data_roots"));
  for (const auto& root : tenant_roots) {
    v1::TenantDataRoot* added = node.add_tenant_data_roots();
    added->set_tenant(root.value("tenant", std::string()));
    added->set_path(root.value("path", std::string()));
  }
  node.set_memory_per_slot_bytes(row.Get<int64_t>("memory_per_slot_bytes"));
  const nlohmann::json devices = nlohmann::json::parse(row.Get<std::string>("devices"));
  google::protobuf::util::JsonParseOptions lenient;
  lenient.ignore_unknown_fields = true;  // written by a newer api
  for (const auto& device : devices) {
    v1::DeviceInfo info;
    if (google::protobuf::util::JsonStringToMessage(device.dump(), &info, lenient).ok()) {
      *node.add_devices() = std::move(info);
    }
  }
  node.set_state(NodeStateOf(row));
  if (!row.IsNull("heartbeat_us")) {
    *node.mutable_last_heartbeat_time() = MicrosColumn(row, "heartbeat_us");
  }
  node.set_slots_in_use(row.Get<int32_t>("slots_in_use"));
  return node;
}

absl::StatusOr<v1::Node> ReadNode(db::Transaction& tx, const std::string& node) {
  GRADHUB_ASSIGN_OR_RETURN(
      db::Result rows,
      tx.Exec(absl::StrCat("SELECT ", kNodeColumns, " FROM nodes n WHERE n.name = $1"), {node}));
  if (rows.empty()) return NodeNotFound("nodes/" + node);
  return NodeFromRow(rows.row(0));
}

const char* RankStateName(v1::RankStatus::State state) {
  switch (state) {
    case v1::RankStatus::STARTING:
      return "STARTING";
    case v1::RankStatus::RUNNING:
      return "RUNNING";
    case v1::RankStatus::SUCCEEDED:
      return "SUCCEEDED";
    case v1::RankStatus::FAILED:
      return "FAILED";
    case v1::RankStatus::STOPPED:
      return "STOPPED";
    default:
      return nullptr;
  }
}

// Records one reported rank on its assignment row, if the row is this node's and still live.
// A rank being stopped that exits, however it exits, is STOPPED: its failure is not news.
absl::Status RecordRank(db::Transaction& tx, int64_t node_id, const v1::RankStatus& status) {
  const char* state = RankStateName(status.state());
  const std::string job_id = JobId(status.job());
  if (state == nullptr || job_id.empty()) return absl::OkStatus();
  const int64_t step_us =
      status.has_last_step_time() ? TimeUtil::TimestampToMicroseconds(status.last_step_time()) : 0;
  // The message is the rank's last stderr lines, a tenant's bytes: PostgreSQL text holds no
  // NUL, and a parameter holding one fails the whole heartbeat (db/error.h).
  std::string message = status.message();
  message.erase(std::remove(message.begin(), message.end(), '\0'), message.end());
  const std::string sql = absl::StrCat(
      "UPDATE rank_assignments a SET"
      " state = CASE"
      "   WHEN a.state = 'STOPPING' AND $5 IN ('SUCCEEDED', 'FAILED', 'STOPPED') THEN 'STOPPED'"
      "   WHEN a.state = 'STOPPING' THEN 'STOPPING'"
      "   WHEN a.state = 'RUNNING' AND $5 = 'STARTING' THEN 'RUNNING'"
      "   ELSE $5 END,"
      " pid = nullif($6::int, 0), last_step = greatest(a.last_step, $7::bigint),"
      " last_step_time = CASE WHEN $7::bigint > a.last_step AND $8::bigint > 0"
      "   THEN timestamptz 'epoch' + $8::bigint * interval '1 microsecond'"
      "   ELSE a.last_step_time END,"
      " exit_code = nullif($9, 0), signal = nullif($10, 0), message = $11,"
      " update_time = CASE WHEN a.state = $5 THEN a.update_time ELSE now() END"
      " WHERE a.job_id = $1::uuid AND a.attempt = $2 AND a.rank = $3 AND a.node_id = $4"
      " AND a.state IN ",
      kLiveRankStatesSql);
  return tx
      .Exec(sql,
            {job_id, status.attempt(), status.rank(), node_id, std::string(state), status.pid(),
             status.last_step(), step_us, status.exit_code(), status.signal(), message})
      .status();
}

// Every live rank row on the node with what FateOfLiveRank needs (step 3), in ONE statement
// and so from one snapshot. Reading the desired set and then the live rows in a second
// statement under READ COMMITTED let a placement committed between the two look live but
// undesired, and be stopped before its agent ever saw it (issue 23; scheduler_test
// APlacementCommittedDuringAHeartbeatIsNotStopped). Rows placed after this snapshot are simply
// not seen: the next heartbeat hands them out.
absl::StatusOr<db::Result> ReadNodeRanks(db::Transaction& tx, int64_t node_id) {
  return tx.Exec(
      absl::StrCat(
          "SELECT a.job_id::text AS job_id, a.attempt, a.rank, a.local_rank, a.slot, a.state,"
          " j.state AS job_state, at.state AS attempt_state, at.discard_ranks,"
          " j.current_attempt = a.attempt AS current_attempt, j.world_size,"
          // The spec only where the rank may be desired: it is what makes a heartbeat heavy.
          " CASE WHEN a.state <> 'STOPPING' THEN j.spec::text ELSE '' END AS spec,"
          " at.rendezvous_prefix,"
          " (SELECT count(*) FROM rank_assignments b WHERE b.job_id = a.job_id"
          "   AND b.attempt = a.attempt AND b.node_id = a.node_id)::int AS local_world_size,"
          " coalesce(s.master_addr, '') AS master_addr, coalesce(s.master_port, 0) AS master_port,"
          " coalesce(s.group_rank, 0) AS group_rank, 'tenants/' || t.name AS tenant"
          " FROM rank_assignments a JOIN jobs j ON j.id = a.job_id"
          " JOIN tenants t ON t.id = j.tenant_id"
          " JOIN job_attempts at ON at.job_id = a.job_id AND at.attempt = a.attempt"
          // torchrun's rendezvous (RankAssignment.master_*, group_rank): rank 0's node, its
          // port, this node's index. Only for a script job's rank that may be desired; for the
          // others the filter is false once per row and nothing is read (a heartbeat's path).
          " LEFT JOIN LATERAL (SELECT m.address AS master_addr,"
          "   CASE WHEN m.master_port_base > 0 THEN m.master_port_base + r0.slot ELSE 0 END"
          "     AS master_port,"
          "   (SELECT count(DISTINCT b.node_id) FROM rank_assignments b WHERE b.job_id = a.job_id"
          "     AND b.attempt = a.attempt AND b.rank < (SELECT min(c.rank) FROM rank_assignments c"
          "     WHERE c.job_id = a.job_id AND c.attempt = a.attempt AND c.node_id = a.node_id)"
          "   )::int AS group_rank"
          "   FROM rank_assignments r0 JOIN nodes m ON m.id = r0.node_id"
          "   WHERE j.spec ? 'script' AND a.state <> 'STOPPING' AND r0.job_id = a.job_id"
          "   AND r0.attempt = a.attempt AND r0.rank = 0) s ON true"
          " WHERE a.node_id = $1 AND a.state IN ",
          kLiveRankStatesSql, " ORDER BY a.job_id, a.rank"),
      {node_id});
}

// A row of ReadNodeRanks as FateOfLiveRank takes it.
LiveRank LiveRankOf(const db::Row& row, bool running_on_agent) {
  return {row.Get<std::string>("state"),
          row.Get<std::string>("job_state"),
          row.Get<std::string>("attempt_state"),
          row.Get<bool>("current_attempt"),
          running_on_agent,
          row.Get<bool>("discard_ranks")};
}

// Step 4a: names the row's attempt in the answer's discarded_attempts (once) when its agent is
// to stop the rank at once (StopsAtOnce).
void AddIfDiscarded(const db::Row& row, const LiveRank& rank,
                    std::set<std::pair<std::string, int32_t>>& named,
                    v1::HeartbeatResponse& response) {
  if (!StopsAtOnce(rank)) return;
  const std::pair<std::string, int32_t> attempt("jobs/" + row.Get<std::string>("job_id"),
                                                row.Get<int32_t>("attempt"));
  if (!named.insert(attempt).second) return;
  v1::AttemptRef* ref = response.add_discarded_attempts();
  ref->set_job(attempt.first);
  ref->set_attempt(attempt.second);
}

// The assignment handed to the agent for a desired row of ReadNodeRanks.
absl::StatusOr<v1::RankAssignment> AssignmentFromRow(const db::Row& row, bool cuda,
                                                     const std::string& store_address) {
  v1::RankAssignment rank;
  rank.set_job("jobs/" + row.Get<std::string>("job_id"));
  rank.set_attempt(row.Get<int32_t>("attempt"));
  rank.set_rank(row.Get<int32_t>("rank"));
  rank.set_world_size(row.Get<int32_t>("world_size"));
  rank.set_local_rank(row.Get<int32_t>("local_rank"));
  rank.set_local_world_size(row.Get<int32_t>("local_world_size"));
  if (cuda) rank.add_device_indices(row.Get<int32_t>("slot"));
  rank.set_rendezvous_prefix(row.Get<std::string>("rendezvous_prefix"));
  rank.set_store_address(store_address);
  rank.set_master_addr(row.Get<std::string>("master_addr"));
  rank.set_master_port(row.Get<int32_t>("master_port"));
  rank.set_group_rank(row.Get<int32_t>("group_rank"));
  rank.set_tenant(row.Get<std::string>("tenant"));
  // As submitted (no defaults written in); the trainer applies WithDefaults.
  auto parsed = google::protobuf::util::JsonStringToMessage(row.Get<std::string>("spec"),
                                                            rank.mutable_spec());
  if (!parsed.ok()) return absl::InternalError(absl::StrCat("stored spec: ", parsed.ToString()));
  return rank;
}

// An undesired live row of ReadNodeRanks whose fate is kStopping or kStopped. Only from the
// state read: a row changed since is left to the next heartbeat.
absl::Status RetireRank(db::Transaction& tx, int64_t node_id, const db::Row& row, RankFate fate) {
  const std::string state = row.Get<std::string>("state");
  const std::string next = fate == RankFate::kStopping ? "STOPPING" : "STOPPED";
  if (state == next) return absl::OkStatus();
  return tx
      .Exec(
          "UPDATE rank_assignments SET state = $5, update_time = now()"
          " WHERE job_id = $1::uuid AND attempt = $2 AND rank = $3 AND node_id = $4"
          " AND state = $6",
          {row.Get<std::string>("job_id"), row.Get<int32_t>("attempt"), row.Get<int32_t>("rank"),
           node_id, next, state})
      .status();
}

// The node's row (id, state, device_kind, last_heartbeat_seq) if `session` is its current
// session; FAILED_PRECONDITION otherwise (step 6). `lock` is appended to the SELECT.
absl::StatusOr<db::Result> ReadSession(db::Transaction& tx, const std::string& name,
                                       const std::string& session, const char* lock) {
  GRADHUB_ASSIGN_OR_RETURN(
      db::Result rows,
      tx.Exec(absl::StrCat("SELECT id, state, device_kind, coalesce(session_id::text, '') AS"
                           " session_id, last_heartbeat_seq FROM nodes WHERE name = $1",
                           lock),
              {name}));
  if (rows.empty() || rows.row(0).Get<std::string>("session_id") != session ||
      rows.row(0).Get<std::string>("state") == "LOST") {
    return absl::FailedPreconditionError(absl::StrCat(
        "session '", session, "' of nodes/", name,
        " is not current (superseded, or the node was lost); stop every rank and register"));
  }
  return rows;
}

void SetDuration(absl::Duration duration, google::protobuf::Duration* out) {
  *out = TimeUtil::MicrosecondsToDuration(absl::ToInt64Microseconds(duration));
}

// RegisterNode's checks of the node it describes; `name` is NodeId of its name.
absl::Status CheckNode(const v1::Node& node, const std::string& name) {
  std::string problems;
  if (name.empty()) {
    absl::StrAppend(&problems, " node.name: '", node.name(),
                    "' is not nodes/NAME with NAME matching [a-zA-Z0-9][a-zA-Z0-9._-]{0,62};");
  }
  if (node.slots() < 0 || node.slots() > kMaxSlots) {
    absl::StrAppend(&problems, " node.slots: ", node.slots(), " is not in [0, ", kMaxSlots, "];");
  }
  if (node.master_port_base() != 0 &&
      (node.master_port_base() < 1024 || node.master_port_base() + node.slots() > 65536)) {
    absl::StrAppend(&problems, " node.master_port_base: ", node.master_port_base(),
                    " must be 0 or a port >= 1024 with a port for each slot below 65536;");
  }
  // Clean, so that CreateJob and the scheduler can compare spec paths with them as strings.
  for (const std::string& root : node.data_roots()) {
    if (!IsCleanPath(root)) {
      absl::StrAppend(&problems, " node.data_roots: '", root,
                      "' is not an absolute path without '.' or '..' components;");
    }
  }
  if (node.memory_per_slot_bytes() < 0) {
    absl::StrAppend(&problems, " node.memory_per_slot_bytes: ", node.memory_per_slot_bytes(),
                    " is negative (0 = no limit);");
  }
  static const std::regex kTenant("tenants/[a-z][a-z0-9-]{0,62}");
  for (const v1::TenantDataRoot& root : node.tenant_data_roots()) {
    if (!std::regex_match(root.tenant(), kTenant)) {
      absl::StrAppend(&problems, " node.tenant_data_roots.tenant: '", root.tenant(),
                      "' is not tenants/{tenant_id};");
    }
    if (!IsCleanPath(root.path())) {
      absl::StrAppend(&problems, " node.tenant_data_roots.path: '", root.path(),
                      "' is not an absolute path without '.' or '..' components;");
    }
  }
  if (!problems.empty()) {
    problems.pop_back();
    return absl::InvalidArgumentError(absl::StrCat("invalid node:", problems));
  }
  return absl::OkStatus();
}

}  // namespace

std::string NodeId(const std::string& name) {
  static const std::regex kNode("(?:nodes/)?([a-zA-Z0-9][a-zA-Z0-9._-]{0,62})");
  std::smatch match;
  return std::regex_match(name, match, kNode) ? match[1].str() : "";
}

void NodeManager::set_store_address(std::string address) {
  std::lock_guard<std::mutex> lock(mu_);
  store_address_ = std::move(address);
}

std::string NodeManager::store_address() const {
  std::lock_guard<std::mutex> lock(mu_);
  return store_address_;
}

absl::StatusOr<v1::RegisterNodeResponse> NodeManager::RegisterNode(
    const v1::RegisterNodeRequest& request) {
  const v1::Node& node = request.node();
  const std::string name = NodeId(node.name());
  GRADHUB_RETURN_IF_ERROR(CheckNode(node, name));
  return pool_->Transact([&](db::Transaction& tx) -> absl::StatusOr<v1::RegisterNodeResponse> {
    GRADHUB_ASSIGN_OR_RETURN(
        db::Result existing,
        tx.Exec("SELECT id FROM nodes WHERE name = $1 FOR NO KEY UPDATE", {name}));
    if (!existing.empty()) {
      GRADHUB_RETURN_IF_ERROR(
          ForgetRanksOnNode(tx, existing.row(0).Get<int64_t>("id"), name,
                            "the agent of nodes/" + name + " restarted; its ranks are gone"));
    }
    GRADHUB_ASSIGN_OR_RETURN(
        db::Result session,
        tx.Exec("INSERT INTO nodes (name, device_kind, slots, labels, address, agent_version,"
                " session_id, last_heartbeat_time, data_roots, devices, master_port_base,"
                " memory_per_slot_bytes, tenant_data_roots)"
                " VALUES ($1, $2, $3, $4::jsonb, $5, $6, gen_random_uuid(), now(), $7::jsonb,"
                " $8::jsonb, $9, $10, $11::jsonb)"
                " ON CONFLICT (name) DO UPDATE SET device_kind = EXCLUDED.device_kind,"
                " slots = EXCLUDED.slots, labels = EXCLUDED.labels, address = EXCLUDED.address,"
                " agent_version = EXCLUDED.agent_version, session_id = EXCLUDED.session_id,"
                " data_roots = EXCLUDED.data_roots, devices = EXCLUDED.devices,"
                " master_port_base = EXCLUDED.master_port_base,"
                " memory_per_slot_bytes = EXCLUDED.memory_per_slot_bytes,"
                " tenant_data_roots = EXCLUDED.tenant_data_roots, last_heartbeat_seq = 0,"
                " last_heartbeat_time = now(),"
                " state = CASE WHEN nodes.state = 'LOST' THEN 'READY' ELSE nodes.state END"
                " RETURNING session_id::text AS session_id",
                {name, node.kind() == v1::Node::CUDA ? "CUDA" : "CPU", node.slots(),
                 LabelsJson(node.labels()), node.address(), node.agent_version(),
                 RootsJson(node.data_roots()), DevicesJson(node.devices()), node.master_port_base(),
                 node.memory_per_slot_bytes(), TenantRootsJson(node.tenant_data_roots())}));
    v1::RegisterNodeResponse response;
    response.set_session_id(session.row(0).Get<std::string>("session_id"));
    SetDuration(options_.heartbeat_interval, response.mutable_heartbeat_interval());
    GRADHUB_ASSIGN_OR_RETURN(*response.mutable_node(), ReadNode(tx, name));
    return response;
  });
}

absl::StatusOr<v1::HeartbeatResponse> NodeManager::Heartbeat(const v1::HeartbeatRequest& request) {
  const std::string name = NodeId(request.node());
  if (name.empty()) return absl::InvalidArgumentError("node: not nodes/NAME");
  return pool_->Transact([&](db::Transaction& tx) -> absl::StatusOr<v1::HeartbeatResponse> {
    GRADHUB_ASSIGN_OR_RETURN(const db::Result rows,
                             ReadSession(tx, name, request.session_id(), " FOR NO KEY UPDATE"));
    const int64_t node_id = rows.row(0).Get<int64_t>("id");
    const bool cuda = rows.row(0).Get<std::string>("device_kind") == "CUDA";
    // A late duplicate (step 5) is answered but not recorded: a newer report already was.
    const bool fresh = request.seq() > rows.row(0).Get<int64_t>("last_heartbeat_seq");
    std::set<RankKey> alive;
    if (fresh) {
      for (const v1::RankStatus& rank : request.ranks()) {
        GRADHUB_RETURN_IF_ERROR(RecordRank(tx, node_id, rank));
        if (rank.state() == v1::RankStatus::STARTING || rank.state() == v1::RankStatus::RUNNING) {
          alive.emplace(JobId(rank.job()), rank.attempt(), rank.rank());
        }
      }
    }
    GRADHUB_RETURN_IF_ERROR(
        tx.Exec("UPDATE nodes SET last_heartbeat_time = now(),"
                " last_heartbeat_seq = greatest(last_heartbeat_seq, $2) WHERE id = $1",
                {node_id, request.seq()})
            .status());

    // The desired set (step 3) and what is no longer live, from one snapshot (ReadNodeRanks).
    GRADHUB_ASSIGN_OR_RETURN(const db::Result ranks, ReadNodeRanks(tx, node_id));
    if (options_.after_desired_read_for_test) options_.after_desired_read_for_test();
    v1::HeartbeatResponse response;
    const std::string store_address = this->store_address();
    std::set<std::pair<std::string, int32_t>> discarded;
    for (const db::Row& row : ranks) {
      const RankKey key(row.Get<std::string>("job_id"), row.Get<int32_t>("attempt"),
                        row.Get<int32_t>("rank"));
      const LiveRank live = LiveRankOf(row, alive.count(key) > 0);
      const RankFate fate = FateOfLiveRank(live, fresh);
      if (fate == RankFate::kDesired) {
        GRADHUB_ASSIGN_OR_RETURN(*response.add_desired_ranks(),
                                 AssignmentFromRow(row, cuda, store_address));
        continue;
      }
      AddIfDiscarded(row, live, discarded, response);
      if (fate != RankFate::kUnchanged) {
        // Not desired: still running there (the agent stops it), or gone (a cancelled job's
        // rank that never started, one the agent stopped and dropped), which frees its slot.
        GRADHUB_RETURN_IF_ERROR(RetireRank(tx, node_id, row, fate));
      }
    }
    response.set_node_state(NodeStateOf(rows.row(0)));
    SetDuration(options_.heartbeat_interval, response.mutable_heartbeat_interval());
    return response;
  });
}

absl::StatusOr<v1::WatchAssignmentsResponse> NodeManager::DesiredAssignments(
    const v1::WatchAssignmentsRequest& request) {
  const std::string name = NodeId(request.node());
  if (name.empty()) return absl::InvalidArgumentError("node: not nodes/NAME");
  return pool_->Transact(
      [&](db::Transaction& tx) -> absl::StatusOr<v1::WatchAssignmentsResponse> {
        GRADHUB_ASSIGN_OR_RETURN(const db::Result rows,
                                 ReadSession(tx, name, request.session_id(), ""));
        const int64_t node_id = rows.row(0).Get<int64_t>("id");
        const bool cuda = rows.row(0).Get<std::string>("device_kind") == "CUDA";
        GRADHUB_ASSIGN_OR_RETURN(const db::Result ranks, ReadNodeRanks(tx, node_id));
        v1::WatchAssignmentsResponse response;
        const std::string store_address = this->store_address();
        for (const db::Row& row : ranks) {
          if (FateOfLiveRank(LiveRankOf(row, false), /*fresh_report=*/false) !=
              RankFate::kDesired) {
            continue;
          }
          GRADHUB_ASSIGN_OR_RETURN(*response.add_desired_ranks(),
                                   AssignmentFromRow(row, cuda, store_address));
        }
        response.set_node_state(NodeStateOf(rows.row(0)));
        return response;
      },
      {.read_only = true});
}

absl::StatusOr<std::string> NodeManager::CheckRankOnNode(
    const v1::IssueRankCredentialRequest& request) {
  const std::string name = NodeId(request.node());
  if (name.empty()) return absl::InvalidArgumentError("node: not nodes/NAME");
  const std::string job_id = JobId(request.job());
  if (job_id.empty()) return absl::InvalidArgumentError("job: not jobs/ID");
  return pool_->Transact([&](db::Transaction& tx) -> absl::StatusOr<std::string> {
    GRADHUB_ASSIGN_OR_RETURN(const db::Result node,
                             ReadSession(tx, name, request.session_id(), ""));
    GRADHUB_ASSIGN_OR_RETURN(
        const db::Result rows,
        tx.Exec("SELECT 1 FROM rank_assignments a JOIN jobs j ON j.id = a.job_id"
                " WHERE a.job_id = $1::uuid AND a.attempt = $2 AND a.rank = $3"
                " AND a.node_id = $4 AND a.state IN ('ASSIGNED', 'STARTING', 'RUNNING')"
                " AND j.current_attempt = a.attempt",
                {job_id, request.attempt(), request.rank(), node.row(0).Get<int64_t>("id")}));
    if (rows.empty()) {
      return absl::NotFoundError(absl::StrCat("rank ", request.rank(), " of attempt ",
                                              request.attempt(), " of ", request.job(),
                                              " is not live on nodes/", name));
    }
    return job_id;
  });
}

absl::StatusOr<int64_t> NodeManager::StoreLogs(const v1::ReportLogsRequest& request) {
  const std::string job_id = JobId(request.job());
  if (job_id.empty()) return absl::InvalidArgumentError("job: not jobs/{uuid}");
  if (request.first_seq() < 1) return absl::InvalidArgumentError("first_seq: must be at least 1");
  const int64_t last_seq = request.first_seq() + request.lines_size() - 1;
  if (request.lines_size() == 0) return last_seq;
  nlohmann::json lines = nlohmann::json::array();
  const std::string stream = request.stream() == v1::LogEntry::STDERR ? "STDERR" : "STDOUT";
  // Rank 0's progress and evaluation lines are also the job's history (job_metrics.h), and
  // its skipped checkpoints the job's events (trainer_events.h).
  const bool history = request.rank() == 0 && stream == "STDOUT";
  std::vector<MetricLine> points;
  std::vector<SkippedCheckpoint> skipped;
  for (std::string line : request.lines()) {
    // PostgreSQL text cannot hold NUL.
    line.erase(std::remove(line.begin(), line.end(), '\0'), line.end());
    if (history) {
      if (std::optional<MetricLine> point = ParseMetricLine(line)) {
        points.push_back(*std::move(point));
      } else if (std::optional<SkippedCheckpoint> skip = ParseSkippedCheckpoint(line)) {
        skipped.push_back(*skip);
      }
    }
    lines.push_back(std::move(line));
  }
  return pool_->Transact([&](db::Transaction& tx) -> absl::StatusOr<int64_t> {
    // Lines of an attempt that does not exist (or was purged) are dropped, as nodes.proto says.
    GRADHUB_RETURN_IF_ERROR(
        tx.Exec("INSERT INTO job_logs (job_id, attempt, rank, stream, seq, line)"
                " SELECT $1::uuid, $2, $3, $4, $5 + t.i - 1, t.line"
                " FROM jsonb_array_elements_text($6::jsonb) WITH ORDINALITY AS t(line, i)"
                " WHERE EXISTS (SELECT 1 FROM job_attempts"
                "   WHERE job_id = $1::uuid AND attempt = $2)"
                " ON CONFLICT DO NOTHING",
                {job_id, request.attempt(), request.rank(), stream, request.first_seq(),
                 lines.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)})
            .status());
    // Rank 0 reports the job's progress; only its current attempt's lines count.
    GRADHUB_RETURN_IF_ERROR(RecordJobProgress(tx, job_id, request.attempt(), points));
    GRADHUB_RETURN_IF_ERROR(RecordMetricPoints(tx, job_id, request.attempt(), points));
    GRADHUB_RETURN_IF_ERROR(RecordSkippedCheckpoints(tx, job_id, request.attempt(), skipped));
    return last_seq;
  });
}

absl::StatusOr<v1::ListNodesResponse> NodeManager::ListNodes(const v1::ListNodesRequest& request) {
  GRADHUB_ASSIGN_OR_RETURN(const int32_t page_size, ListPageSize(request.page_size()));
  // The name of the last node of the page before (page_token.h).
  GRADHUB_ASSIGN_OR_RETURN(const std::string after,
                           ReadNamePageToken(request.page_token(), "nodes"));
  std::string sql = absl::StrCat("SELECT ", kNodeColumns, " FROM nodes n WHERE n.name > $1");
  db::ParamList params = {after};
  GRADHUB_ASSIGN_OR_RETURN(std::vector<FilterTerm> terms, ParseListFilter(request.filter()));
  for (const FilterTerm& term : terms) {
    if (term.field == "state") {
      v1::Node::State state;
      if (!v1::Node::State_Parse(term.value, &state) || state == v1::Node::STATE_UNSPECIFIED) {
        return absl::InvalidArgumentError(
            absl::StrCat("filter: state '", term.value, "' is not a node state"));
      }
      absl::StrAppend(&sql, " AND n.state = ", params.Bind(term.value));
    } else if (term.field == "kind") {
      v1::Node::DeviceKind kind;
      if (!v1::Node::DeviceKind_Parse(term.value, &kind)) {
        return absl::InvalidArgumentError(
            absl::StrCat("filter: kind '", term.value, "' is not CPU or CUDA"));
      }
      absl::StrAppend(&sql, " AND n.device_kind = ", params.Bind(term.value));
    } else if (auto labels = LabelCondition(term, "n.labels", params)) {
      absl::StrAppend(&sql, " AND ", *labels);
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("filter: unknown field '", term.field, "' (state, kind, labels.KEY)"));
    }
  }
  absl::StrAppend(&sql, " ORDER BY n.name LIMIT ", params.Bind(page_size + 1));
  GRADHUB_ASSIGN_OR_RETURN(db::Result rows, pool_->Exec(sql, params.values()));
  v1::ListNodesResponse response;
  for (int i = 0; i < rows.rows() && i < page_size; ++i) {
    *response.add_nodes() = NodeFromRow(rows.row(i));
  }
  if (rows.rows() > page_size) {
    response.set_next_page_token(
        MakePageToken("nodes", {rows.row(page_size - 1).Get<std::string>("name")}));
  }
  return response;
}

absl::StatusOr<v1::Node> NodeManager::GetNode(const std::string& name) {
  const std::string node = NodeId(name);
  if (node.empty()) return NodeNotFound(name);
  return pool_->Transact([&](db::Transaction& tx) { return ReadNode(tx, node); },
                         {.read_only = true});
}

absl::StatusOr<v1::Node> NodeManager::CordonNode(const std::string& name, bool cordon) {
  const std::string node = NodeId(name);
  if (node.empty()) return NodeNotFound(name);
  return pool_->Transact([&](db::Transaction& tx) -> absl::StatusOr<v1::Node> {
    GRADHUB_ASSIGN_OR_RETURN(
        db::Result updated,
        tx.Exec("UPDATE nodes SET state = CASE"
                " WHEN $2 AND state = 'READY' THEN 'CORDONED'"
                " WHEN NOT $2 AND state IN ('CORDONED', 'DRAINING') THEN 'READY'"
                " ELSE state END WHERE name = $1 RETURNING id",
                {node, cordon}));
    if (updated.empty()) return NodeNotFound(name);
    return ReadNode(tx, node);
  });
}

absl::StatusOr<v1::Node> NodeManager::DrainNode(const std::string& name) {
  const std::string node = NodeId(name);
  if (node.empty()) return NodeNotFound(name);
  return pool_->Transact([&](db::Transaction& tx) -> absl::StatusOr<v1::Node> {
    GRADHUB_ASSIGN_OR_RETURN(
        db::Result updated,
        tx.Exec("UPDATE nodes SET state = CASE WHEN state IN ('READY', 'CORDONED')"
                " THEN 'DRAINING' ELSE state END WHERE name = $1 RETURNING id",
                {node}));
    if (updated.empty()) return NodeNotFound(name);
    return ReadNode(tx, node);
  });
}

}  // namespace gradhub::api
