// The REST+JSON face of gradhub-api (cpp-httplib): JobService, the operators' NodeService
// calls and AdminService, with the same messages in the proto3 JSON mapping, at the paths the
// protos give in the "REST:" comment above each rpc. It calls the same managers as the gRPC
// adapters (JobManager, NodeManager, TenantManager) and authorizes through the same
// Authenticator rules, so the two cannot drift; no logic of its own but transport: status
// codes, body limits, JSON parsing, newline-delimited JSON for streams. Also serves /healthz,
// /readyz and /metrics.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "services/api/api_metrics.h"
#include "services/api/audit_reader.h"
#include "services/api/job_manager.h"
#include "services/api/node_manager.h"
#include "services/api/tenant_manager.h"
#include "services/common/audit/call_auditor.h"
#include "services/common/auth/authenticator.h"
#include "services/common/http_server.h"
#include "services/common/keyed_slots.h"

namespace httplib {
class Server;
}

namespace gradhub::api {

// The listener's options (TLS, body size, connection and time limits) and the stream limits.
struct RestGatewayOptions : HttpServerOptions {
  StreamLimits streams;
};

// What the gateway serves. None owned; all must outlive the gateway, and all but the audit log's
// are required.
struct RestBackends {
  JobManager* jobs = nullptr;
  NodeManager* nodes = nullptr;
  TenantManager* tenants = nullptr;
  const Authenticator* auth = nullptr;
  ApiMetrics* metrics = nullptr;
  // Called after a drain, as NodeService calls its on_change: the scheduler's Nudge, so the
  // node's ranks move at once. Empty = the next scheduler pass finds them.
  std::function<void()> on_nodes_changed;
  // GET /v1/auditEvents reads `audit_events` (nullptr: UNIMPLEMENTED); `auditor` records the
  // audited calls (services/common/audit/http_audit.h; nullptr: none).
  const AuditReader* audit_events = nullptr;
  audit::CallAuditor* auditor = nullptr;
  // A line for /readyz saying which replica leads (leader_lease.h); empty = none.
  std::function<std::string()> leadership;
};

// Thread-safety: Start and Stop are called by the thread that owns the gateway (Stop also from
// the destructor), never concurrently. Requests are served on cpp-httplib's worker threads,
// which call only the thread-safe methods of the backends.
class RestGateway {
 public:
  explicit RestGateway(RestBackends backends, RestGatewayOptions options = {});
  ~RestGateway();  // Stop()

  // Binds host:port (0 = a free port) and serves on a background thread. Returns the port.
  absl::StatusOr<int> Start(const std::string& host, int port);
  // Stops accepting, ends streams, lets in-flight requests finish, joins the thread.
  // Idempotent.
  void Stop();

 private:
  // Every route and hook, once, from the constructor.
  void Route();
  void InstallHooks();     // request records for the metrics; httplib's own errors as ours
  void RouteProbes();      // /healthz, /readyz, /metrics
  void RouteJobs();        // the unary JobService calls on jobs
  void RouteJobHistory();  // ListJobEvents and GetJobMetrics
  void RouteJobStreams();  // WatchJob and GetJobLogs as newline-delimited JSON
  void RouteNodes();       // NodeService's operator calls (admin token)
  void RouteTenants();     // AdminService (admin token)
  void RouteAudit();       // AuditService.ListAuditEvents

  RestBackends backends_;
  RestGatewayOptions options_;
  KeyedSlots streams_;  // watch and log streams (StreamLimits)
  std::unique_ptr<httplib::Server> server_;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

}  // namespace gradhub::api
