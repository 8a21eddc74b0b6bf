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
#include "services/common/group_commit.h"

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

// The columns an event is written with, in AuditRecord's order but for job_id (which only finds
// the tenant): for every writer of `audit_events` (PostgresAuditLog, and JobInserter, which
// writes an OK CreateJob's event with its job).
inline constexpr char kAuditEventColumns[] =
    "actor, tenant, method, resource, outcome, message, transport, peer";

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

// Thread-safe: Append and List run on pooled connections.
//
// Cost and durability. Every audited call waits for its row, so a row must not cost a second
// durable commit: a closed loop of CreateJobs waited for two WAL flushes per call and made half
// the creates a second (tests/bench/create_jobs). So:
//   1. the Appends of concurrent calls share one INSERT and one commit (group_commit.h);
//   2. that commit does not wait for its WAL flush (synchronous_commit = off for the
//      transaction only). The row is visible to every reader once Append returns, before the
//      call is answered; it is on disk at the next synchronous commit of anything (the call's
//      own, for a call that changed something, came before it) or by the WAL writer within
//      3 x wal_writer_delay (600 ms by default). A crash of PostgreSQL itself may thus lose the
//      audit rows of the last fraction of a second, never a row of the jobs or tokens.
// Even so, a create waited for a second transaction's round trips after its job's commit, which
// doubled its median latency at 1,000 creates/s. So an OK CreateJob's row is not written here:
// the job's own statement writes it (AuditedRpc::ok_event_written_by_handler, JobInserter), as
// durable as the job.
class PostgresAuditLog final : public AuditLog {
 public:
  // Rows per INSERT; also caps the distinct statement texts prepared per connection.
  static constexpr int kMaxBatch = 32;

  // Not owned; must outlive this.
  explicit PostgresAuditLog(db::Pool* pool);

  // Blocks until the row is committed. A row the database refuses fails alone: a batch that
  // fails is written again one row at a time.
  absl::Status Append(const AuditRecord& record) override;
  absl::StatusOr<std::vector<StoredAuditEvent>> List(const AuditQuery& query) override;

 private:
  std::vector<absl::Status> WriteBatch(const std::vector<const AuditRecord*>& records);
  // `records` in one INSERT and one transaction: all written, or none.
  absl::Status Insert(const std::vector<const AuditRecord*>& records);

  db::Pool* pool_;
  GroupCommit<AuditRecord, absl::Status> writes_;
};

}  // namespace gradhub::audit
