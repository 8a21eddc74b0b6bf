// Where audit events are kept (audit.proto): the AuditLog seam, and its PostgreSQL backend over
// the `audit_events` table (migrations/0012_audit_log.sql). gradhub-api writes and reads it;
// gradhub-checkpoint, with its own pool, writes it too. Rows are only ever appended.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gradhub/v1/audit.pb.h"
#include "services/common/db/pool.h"

namespace gradhub::audit {

// One finished call, as the recorder resolved it (call_auditor.h). Every text is already
// valid UTF-8 without NUL and within its bounds (audited_calls.h). (Every member has an
// initializer, so that designated initializers may leave any out.)
struct AuditRecord {
  std::string actor = "";
  // tenants/{t}; when empty and `job_id` is set, the row takes that job's tenant (an admin's or
  // an unauthenticated call on a job), found as the row is written.
  std::string tenant = "";
  std::string job_id = "";  // a job's uuid, or ""
  std::string method = "";
  std::string resource = "";
  std::string outcome = "";
  std::string message = "";
  std::string transport = "";
  std::string peer = "";
};

// Which events a listing takes: each set field must match exactly (all of them at once).
struct AuditFilter {
  std::optional<std::string> tenant = std::nullopt;
  std::optional<std::string> actor = std::nullopt;
  // A full name (gradhub.v1.JobService/CancelJob), or the rpc's name alone (CancelJob).
  std::optional<std::string> method = std::nullopt;
  std::optional<std::string> resource = std::nullopt;
  std::optional<std::string> outcome = std::nullopt;
};

struct AuditQuery {
  AuditFilter filter = {};
  int64_t before_id = 0;  // > 0: only events older than this one (a page's continuation)
  int32_t limit = 100;
};

// An event as stored: `event.name` is auditEvents/{id}.
struct StoredAuditEvent {
  int64_t id = 0;
  v1::AuditEvent event;
};

// Thread-safe: Append and List may be called from any request thread at once.
class AuditLog {
 public:
  virtual ~AuditLog() = default;
  virtual absl::Status Append(const AuditRecord& record) = 0;
  // Newest first, at most query.limit.
  virtual absl::StatusOr<std::vector<StoredAuditEvent>> List(const AuditQuery& query) = 0;
};

// Thread-safe as db::Pool is: each call runs one statement on its own pooled connection.
class PostgresAuditLog final : public AuditLog {
 public:
  // Not owned; must outlive this.
  explicit PostgresAuditLog(db::Pool* pool) : pool_(pool) {}

  absl::Status Append(const AuditRecord& record) override;
  absl::StatusOr<std::vector<StoredAuditEvent>> List(const AuditQuery& query) override;

 private:
  db::Pool* pool_;
};

}  // namespace gradhub::audit
