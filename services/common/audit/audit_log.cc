#include "services/common/audit/audit_log.h"

#include <google/protobuf/util/time_util.h>

#include "absl/strings/str_cat.h"
#include "services/common/status_macros.h"

namespace gradhub::audit {
namespace {

// `column = $n` for a set filter field; the method also matches by its rpc name alone.
void AddCondition(const std::optional<std::string>& value, const char* column, std::string& sql,
                  db::ParamList& params) {
  if (!value) return;
  if (std::string(column) == "method" && value->find('/') == std::string::npos) {
    absl::StrAppend(&sql, " AND split_part(method, '/', 2) = ", params.Bind(*value));
    return;
  }
  absl::StrAppend(&sql, " AND ", column, " = ", params.Bind(*value));
}

v1::AuditEvent EventFromRow(const db::Row& row) {
  v1::AuditEvent event;
  event.set_name(absl::StrCat("auditEvents/", row.Get<int64_t>("id")));
  *event.mutable_time() =
      google::protobuf::util::TimeUtil::MicrosecondsToTimestamp(row.Get<int64_t>("time_us"));
  event.set_actor(row.Get<std::string>("actor"));
  event.set_tenant(row.Get<std::string>("tenant"));
  event.set_method(row.Get<std::string>("method"));
  event.set_resource(row.Get<std::string>("resource"));
  event.set_outcome(row.Get<std::string>("outcome"));
  event.set_message(row.Get<std::string>("message"));
  event.set_transport(row.Get<std::string>("transport"));
  event.set_peer(row.Get<std::string>("peer"));
  return event;
}

}  // namespace

PostgresAuditLog::PostgresAuditLog(db::Pool* pool)
    : pool_(pool),
      writes_(
          [this](const std::vector<const AuditRecord*>& records) { return WriteBatch(records); },
          kMaxBatch) {}

absl::Status PostgresAuditLog::Append(const AuditRecord& record) { return writes_.Submit(record); }

std::vector<absl::Status> PostgresAuditLog::WriteBatch(
    const std::vector<const AuditRecord*>& records) {
  const absl::Status together = Insert(records);
  if (together.ok() || records.size() == 1) {
    return std::vector<absl::Status>(records.size(), together);
  }
  // Maybe one row's fault (it should not be: every text is checked before): each on its own.
  std::vector<absl::Status> statuses;
  for (const AuditRecord* record : records) statuses.push_back(Insert({record}));
  return statuses;
}

absl::Status PostgresAuditLog::Insert(const std::vector<const AuditRecord*>& records) {
  db::ParamList params;
  std::string sql = absl::StrCat("INSERT INTO audit_events (", kAuditEventColumns, ") VALUES ");
  for (size_t i = 0; i < records.size(); ++i) {
    const AuditRecord& r = *records[i];
    // An empty tenant with a job: that job's tenant (see AuditRecord).
    absl::StrAppend(&sql, i == 0 ? "" : ", ", "(", params.Bind(r.actor), ", coalesce(NULLIF(",
                    params.Bind(r.tenant), ", ''), (SELECT 'tenants/' || t.name FROM jobs j",
                    " JOIN tenants t ON t.id = j.tenant_id WHERE j.id = ",
                    params.Bind(r.job_id.empty() ? db::Param(std::nullopt) : db::Param(r.job_id)),
                    "::uuid), ''), ", params.Bind(r.method), ", ", params.Bind(r.resource), ", ",
                    params.Bind(r.outcome), ", ", params.Bind(r.message), ", ",
                    params.Bind(r.transport), ", ", params.Bind(r.peer), ")");
  }
  // In a transaction rather than Pool::Exec: a connection lost mid-statement is then retried
  // only when no row can have been written, so no call is recorded twice. Committed without
  // waiting for the WAL flush (see audit_log.h).
  return pool_->Transact(
      [&](db::Transaction& tx) -> absl::Status { return tx.Exec(sql, params.values()).status(); },
      {.synchronous_commit = false});
}

absl::StatusOr<std::vector<StoredAuditEvent>> PostgresAuditLog::List(const AuditQuery& query) {
  std::string sql =
      "SELECT id, (extract(epoch FROM time) * 1e6)::bigint AS time_us, actor, tenant, method,"
      " resource, outcome, message, transport, peer FROM audit_events WHERE true";
  db::ParamList params;
  AddCondition(query.filter.tenant, "tenant", sql, params);
  AddCondition(query.filter.actor, "actor", sql, params);
  AddCondition(query.filter.method, "method", sql, params);
  AddCondition(query.filter.resource, "resource", sql, params);
  AddCondition(query.filter.outcome, "outcome", sql, params);
  if (query.before_id > 0) absl::StrAppend(&sql, " AND id < ", params.Bind(query.before_id));
  absl::StrAppend(&sql, " ORDER BY id DESC LIMIT ", params.Bind(query.limit));
  GRADHUB_ASSIGN_OR_RETURN(db::Result rows, pool_->Exec(sql, params.values()));
  std::vector<StoredAuditEvent> events;
  for (const db::Row& row : rows) events.push_back({row.Get<int64_t>("id"), EventFromRow(row)});
  return events;
}

}  // namespace gradhub::audit
