// The server side of the agent protocol in proto/gradhub/v1/nodes.proto, and the operators'
// node commands: sessions, heartbeats (actual state in, desired state out), rank output, and
// cordon/drain. Domain logic and SQL only; NodeService adapts it to gRPC.
//
// A heartbeat with the session the agent already had is accepted whatever happened to the api
// in between (sessions live in PostgreSQL): after an api restart the ranks it reports are
// adopted as they are (scheduler.h, "The control plane may restart under running jobs"). Its
// desired set and the node's other live ranks are read in one statement, one snapshot, so a
// placement committed during the heartbeat is either handed out or not seen, never stopped.
//
// A heartbeat only records what the agent says and answers with what should run. Deciding
// what a rank's exit means for its job (finish, restart, fail) is the scheduler's controller's
// job, in one place, under its lock.
#pragma once

#include <cstdint>
#include <functional>
#include <mutex>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gradhub/v1/nodes.pb.h"
#include "services/common/contract/defaults.h"
#include "services/common/db/pool.h"

namespace gradhub::api {

struct NodeManagerOptions {
  absl::Duration heartbeat_interval = absl::FromChrono(defaults::kHeartbeatInterval);
  // Test seam: called inside Heartbeat's transaction right after the desired set has been
  // read, before the node's undesired live ranks are marked gone, so that a test can commit a
  // placement in between (tests/integration/job_manager/scheduler_test.cc).
  std::function<void()> after_desired_read_for_test;
};

// Thread-safe: every agent's calls arrive on gRPC's threads at once. Each call is one
// transaction on its own pooled connection; calls of one node are ordered by its row lock and
// its heartbeat seq. The store address is the only state here, under mu_.
class NodeManager {
 public:
  NodeManager(db::Pool* pool, NodeManagerOptions options)
      : pool_(pool), options_(std::move(options)) {}

  // Step 1: a new session; ranks of the node's earlier session fail their attempts as
  // INFRASTRUCTURE (NODE_LOST). INVALID_ARGUMENT naming a bad name or slot count.
  absl::StatusOr<v1::RegisterNodeResponse> RegisterNode(const v1::RegisterNodeRequest& request);

  // Steps 2-6. FAILED_PRECONDITION for a session that is not current (re-register).
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest& request);

  // Step 8: the node's desired set as a read-only snapshot (records nothing, retires nothing).
  // FAILED_PRECONDITION for a session that is not current.
  absl::StatusOr<v1::WatchAssignmentsResponse> DesiredAssignments(
      const v1::WatchAssignmentsRequest& request);

  // Stores one batch of a rank's output (duplicates absorbed) and returns the acked seq. Rank
  // 0's progress lines also update the job's progress, which is what WatchJob shows.
  absl::StatusOr<int64_t> StoreLogs(const v1::ReportLogsRequest& request);

  // IssueRankCredential's check: the job uuid when rank `request.rank` of the attempt is placed
  // on the node under its current session, live (ASSIGNED, STARTING, RUNNING), and its
  // attempt is the job's current one; FAILED_PRECONDITION for a session that is not current,
  // NOT_FOUND otherwise. The adapter then mints the token (Authenticator::CreateJobToken),
  // which is checked again against the attempt at every use.
  absl::StatusOr<std::string> CheckRankOnNode(const v1::IssueRankCredentialRequest& request);

  absl::StatusOr<v1::ListNodesResponse> ListNodes(const v1::ListNodesRequest& request);
  absl::StatusOr<v1::Node> GetNode(const std::string& name);
  absl::StatusOr<v1::Node> CordonNode(const std::string& name, bool cordon);
  absl::StatusOr<v1::Node> DrainNode(const std::string& name);

  // host:port of this api's StoreService as trainers must dial it, sent in every assignment.
  // May be set while calls are served (the port is known only once the server is bound).
  void set_store_address(std::string address);

 private:
  std::string store_address() const;

  db::Pool* pool_;
  const NodeManagerOptions options_;
  mutable std::mutex mu_;
  std::string store_address_;
};

// "nodes/{node}" -> node, or "" when malformed.
std::string NodeId(const std::string& name);

}  // namespace gradhub::api
