#include "services/api/job_inserter.h"

#include <openssl/rand.h>

#include <condition_variable>
#include <map>
#include <optional>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "services/common/job_records.h"
#include "services/common/status_macros.h"

namespace gradhub::api {
namespace {

constexpr int kColumnsPerRow = 15;

// A random (version 4) UUID. Ids are chosen here rather than by PostgreSQL so that a batch
// can be sent again after a lost connection: the rows the first try committed are recognised
// by their ids instead of becoming second jobs.
absl::StatusOr<std::string> NewJobId() {
  unsigned char bytes[16];
  if (RAND_bytes(bytes, sizeof(bytes)) != 1) {
    return absl::InternalError("no randomness for a job id (RAND_bytes failed)");
  }
  bytes[6] = (bytes[6] & 0x0f) | 0x40;
  bytes[8] = (bytes[8] & 0x3f) | 0x80;
  const std::string hex =
      absl::BytesToHexString(absl::string_view(reinterpret_cast<char*>(bytes), sizeof(bytes)));
  return absl::StrCat(hex.substr(0, 8), "-", hex.substr(8, 4), "-", hex.substr(12, 4), "-",
                      hex.substr(16, 4), "-", hex.substr(20));
}

// The statement for `rows` jobs, with their first events and the audit events of the calls
// that made them, returning the jobs it inserted (the spec left out: the caller has it). A row
// whose id or (tenant, request_id) is taken, by an earlier job, by an earlier try of this batch
// or by an earlier row of it, is skipped, and so is its audit event.
std::string InsertStatement(int rows) {
  std::string values;
  for (int row = 0; row < rows; ++row) {
    const int p = row * kColumnsPerRow;
    // Every parameter is cast: in a VALUES list only casts fix the types of later rows.
    absl::StrAppend(&values, row == 0 ? "" : ", ", "($", p + 1, "::uuid, $", p + 2, "::bigint, $",
                    p + 3, "::text, $", p + 4, "::text, $", p + 5, "::jsonb, $", p + 6,
                    "::integer, $", p + 7, "::integer, $", p + 8, "::integer, $", p + 9,
                    "::integer, $", p + 10, "::text, $", p + 11, "::text, $", p + 12, "::text, $",
                    p + 13, "::text, $", p + 14, "::text, $", p + 15, "::text)");
  }
  return absl::StrCat(
      "WITH input (id, tenant_id, request_id, display_name, spec, priority, world_size,"
      " max_infra_restarts, max_job_restarts, state_reason,"
      " event_actor, event_tenant, event_method, event_transport, event_peer) AS (VALUES ",
      values,
      "),"
      " j AS (INSERT INTO jobs (id, tenant_id, request_id, display_name, labels, spec, priority,"
      " world_size, max_infra_restarts, max_job_restarts, state_reason)"
      " SELECT id, tenant_id, request_id, display_name, coalesce(spec -> 'labels', '{}'), spec,"
      " priority, world_size, max_infra_restarts, max_job_restarts, state_reason FROM input"
      " ON CONFLICT DO NOTHING RETURNING *),"
      " submitted AS (INSERT INTO job_events (job_id, attempt, type, to_state, message)"
      " SELECT id, 0, 'STATE_CHANGED', 'PENDING', 'submitted' FROM j),"
      // As PostgresAuditLog writes a row: an empty tenant is the job's.
      " audited AS (INSERT INTO audit_events (",
      audit::kAuditEventColumns,
      ") SELECT i.event_actor, coalesce(NULLIF(i.event_tenant, ''), 'tenants/' || t.name),"
      " i.event_method, 'jobs/' || j.id, 'OK', '', i.event_transport, i.event_peer"
      " FROM j JOIN input i ON i.id = j.id JOIN tenants t ON t.id = j.tenant_id"
      " WHERE i.event_method IS NOT NULL)"
      " SELECT ",
      kJobStateColumns, " FROM j JOIN tenants t ON t.id = j.tenant_id");
}

// The five audit columns of a row: the event's, or NULLs for none.
void AppendEventParams(const std::optional<audit::AuditRecord>& event,
                       std::vector<db::Param>& params) {
  if (!event) {
    params.insert(params.end(), 5, db::Param(std::nullopt));
    return;
  }
  params.insert(params.end(),
                {event->actor, event->tenant, event->method, event->transport, event->peer});
}

// What became of a row the statement skipped: the job an earlier try of its batch made, or the
// job an earlier request made under its request_id if that asked for the same spec. Such a
// retry made no job, but it is a call of its own, so its audit event is written here, in the
// same transaction as the look-up (an earlier try's job has its event already).
absl::StatusOr<v1::Job> SkippedJob(db::Pool& pool, const NewJob& job, const std::string& id) {
  return pool.Transact([&](db::Transaction& tx) -> absl::StatusOr<v1::Job> {
    GRADHUB_ASSIGN_OR_RETURN(
        db::Result found,
        tx.Exec(absl::StrCat("SELECT ", kJobColumns,
                             ", j.id = $1::uuid AS ours,"
                             " j.spec = $4::jsonb AS same_spec"
                             " FROM jobs j JOIN tenants t ON t.id = j.tenant_id"
                             " WHERE j.id = $1::uuid OR (j.tenant_id = $2 AND j.request_id = $3)"),
                {id, job.tenant_id,
                 job.request_id.empty() ? db::Param(std::nullopt) : db::Param(job.request_id),
                 job.spec_json}));
    if (found.empty()) {
      return absl::InternalError(
          "a job row was neither inserted nor found by its id or request_id");
    }
    const db::Row row = found.row(0);
    if (!row.Get<bool>("ours") && !row.Get<bool>("same_spec")) {
      return absl::AlreadyExistsError(
          absl::StrCat("request_id '", job.request_id, "' was used for jobs/",
                       row.Get<std::string>("id"), " with a different spec"));
    }
    GRADHUB_ASSIGN_OR_RETURN(v1::Job existing, JobFromRow(row));
    if (row.Get<bool>("ours") || !job.event) return existing;
    const audit::AuditRecord& event = *job.event;
    GRADHUB_RETURN_IF_ERROR(
        tx.Exec(absl::StrCat("INSERT INTO audit_events (", audit::kAuditEventColumns,
                             ") VALUES ($1, $2, $3, $4, 'OK', '', $5, $6)"),
                {event.actor, event.tenant.empty() ? existing.tenant() : event.tenant, event.method,
                 existing.name(), event.transport, event.peer})
            .status());
    return existing;
  });
}

// Whether a failed batch may have failed for one row's data, so that writing its rows one by
// one gives the others their jobs. Lost connections, timeouts and full pools are not: they
// would fail each row again.
bool MayBeOneRowsFault(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kInternal:
      return true;
    default:
      return false;
  }
}

}  // namespace

struct JobInserter::Request {
  const NewJob* job;
  std::optional<absl::StatusOr<v1::Job>> result;
  std::condition_variable done;  // result set, or a batch slot is free for this request
};

JobInserter::JobInserter(db::Pool* pool, JobInserterOptions options)
    : pool_(pool), options_(options) {}

absl::StatusOr<v1::Job> JobInserter::Insert(const NewJob& job) {
  Request request{&job, std::nullopt, {}};
  std::unique_lock lock(mu_);
  queue_.push_back(&request);
  while (!request.result) {
    if (writing_ >= options_.max_concurrent_batches || queue_.empty()) {
      request.done.wait(lock);
      continue;
    }
    // Lead: write what is queued now, which may or may not include this request (a longer
    // queue is taken oldest first); the loop then goes on until this one has its result.
    std::vector<Request*> batch;
    while (!queue_.empty() && static_cast<int>(batch.size()) < options_.max_batch) {
      batch.push_back(queue_.front());
      queue_.pop_front();
    }
    ++writing_;
    ++stats_.batches;
    stats_.rows += static_cast<int64_t>(batch.size());
    lock.unlock();
    std::vector<const NewJob*> jobs;
    for (const Request* member : batch) jobs.push_back(member->job);
    std::vector<absl::StatusOr<v1::Job>> results = Write(jobs);
    lock.lock();
    --writing_;
    // Set and announced under the lock: a member that saw its result could return and take
    // its condition variable with it before a notify made after unlocking.
    for (size_t i = 0; i < batch.size(); ++i) {
      batch[i]->result = std::move(results[i]);
      if (batch[i] != &request) batch[i]->done.notify_one();
    }
    // The slot just freed goes to the oldest waiter, which would otherwise sleep until some
    // other batch ends.
    if (!queue_.empty()) queue_.front()->done.notify_one();
  }
  return std::move(*request.result);
}

JobInserter::Stats JobInserter::stats() const {
  std::lock_guard lock(mu_);
  Stats stats = stats_;
  stats.queued = static_cast<int64_t>(queue_.size());
  return stats;
}

std::vector<absl::StatusOr<v1::Job>> JobInserter::Write(const std::vector<const NewJob*>& jobs) {
  std::vector<absl::StatusOr<v1::Job>> results;
  const absl::Status status = WriteTogether(jobs, results);
  if (status.ok()) return results;
  results.clear();
  if (jobs.size() > 1 && MayBeOneRowsFault(status)) {
    for (const NewJob* job : jobs) results.push_back(std::move(Write({job})[0]));
  } else {
    results.assign(jobs.size(), status);
  }
  return results;
}

absl::Status JobInserter::WriteTogether(const std::vector<const NewJob*>& jobs,
                                        std::vector<absl::StatusOr<v1::Job>>& results) {
  std::vector<std::string> ids;
  std::vector<db::Param> params;
  params.reserve(jobs.size() * kColumnsPerRow);
  for (const NewJob* job : jobs) {
    GRADHUB_ASSIGN_OR_RETURN(ids.emplace_back(), NewJobId());
    params.insert(params.end(),
                  {ids.back(), job->tenant_id,
                   job->request_id.empty() ? db::Param(std::nullopt) : db::Param(job->request_id),
                   job->display_name, job->spec_json, job->priority, job->world_size,
                   job->max_infra_restarts, job->max_job_restarts, job->state_reason});
    AppendEventParams(job->event, params);
  }
  // One statement is its own transaction, and with the ids fixed above it is safe to send
  // again, which Pool::Exec does after a lost connection: BEGIN and COMMIT would be two more
  // round trips per batch and would leave a commit's outcome unknown when the connection
  // drops during it.
  GRADHUB_ASSIGN_OR_RETURN(db::Result rows,
                           pool_->Exec(InsertStatement(static_cast<int>(jobs.size())), params));
  std::map<std::string, v1::Job> inserted;
  for (const db::Row& row : rows) {
    GRADHUB_ASSIGN_OR_RETURN(v1::Job job, JobFromRow(row, /*with_spec=*/false));
    inserted.emplace(row.Get<std::string>("id"), std::move(job));
  }
  results.clear();
  for (size_t i = 0; i < jobs.size(); ++i) {
    auto it = inserted.find(ids[i]);
    if (it == inserted.end()) {
      // Its own outcome, whatever it is: the rest of the batch is committed and must not be
      // written again.
      results.push_back(SkippedJob(*pool_, *jobs[i], ids[i]));
      continue;
    }
    *it->second.mutable_spec() = jobs[i]->spec;
    results.push_back(std::move(it->second));
  }
  return absl::OkStatus();
}

}  // namespace gradhub::api
