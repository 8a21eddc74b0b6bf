#include "services/checkpoint/checkpoint_access.h"

#include "absl/strings/str_cat.h"
#include "services/common/contract/job_spec.h"
#include "services/common/job_records.h"
#include "services/common/status_macros.h"

namespace gradhub::checkpoint {
namespace {

using Kind = api::Principal::Kind;

const char* LockClause(JobLock lock) {
  switch (lock) {
    case JobLock::kShare:
      return " FOR SHARE";
    case JobLock::kNoKeyUpdate:
      return " FOR NO KEY UPDATE";
    case JobLock::kNone:
      break;
  }
  return "";
}

absl::StatusOr<JobRow> ReadJob(db::Transaction& tx, const std::string& job_id, JobLock lock) {
  if (job_id.empty()) return absl::NotFoundError("job not found");
  GRADHUB_ASSIGN_OR_RETURN(
      db::Result rows,
      tx.Exec(absl::StrCat("SELECT tenant_id, state, current_attempt,"
                           " coalesce((spec #>> '{checkpoint,keepLast}')::int, 0) AS keep_last"
                           " FROM jobs WHERE id = $1::uuid",
                           LockClause(lock)),
              {job_id}));
  if (rows.empty()) return api::JobNotFound("jobs/" + job_id);
  const db::Row row = rows.row(0);
  JobRow job;
  job.id = job_id;
  job.tenant_id = row.Get<int64_t>("tenant_id");
  v1::Job::State_Parse(row.Get<std::string>("state"), &job.state);
  job.current_attempt = row.Get<int32_t>("current_attempt");
  // The stored spec is as submitted: its default (WithDefaults) applies here.
  v1::JobSpec retention;
  retention.mutable_checkpoint()->set_keep_last(row.Get<int32_t>("keep_last"));
  job.keep_last = WithDefaults(std::move(retention)).checkpoint().keep_last();
  return job;
}

}  // namespace

absl::StatusOr<JobRow> ReadJobRow(db::Transaction& tx, const std::string& job_id, JobLock lock) {
  return ReadJob(tx, job_id, lock);
}

absl::StatusOr<Caller> IdentifyCaller(const api::Authenticator& auth,
                                      const std::string& authorization) {
  GRADHUB_ASSIGN_OR_RETURN(api::Principal principal, auth.Authenticate(authorization));
  return Caller{std::move(principal)};
}

std::string CallerKey(const Caller& caller) {
  switch (caller.principal.kind) {
    case Kind::kAdmin:
      return "admin";
    case Kind::kTenant:
      return absl::StrCat("tenant:", caller.principal.tenant_id);
    case Kind::kJob:
      return absl::StrCat("job:", caller.principal.job_id);
    case Kind::kNode:
      break;
  }
  return "node";
}

absl::Status CheckKind(const Caller& caller, Access access) {
  const Kind kind = caller.principal.kind;
  if (kind == Kind::kNode) {
    return absl::PermissionDeniedError(
        "a node token has no checkpoint rights: ranks use their own job token");
  }
  if (kind == Kind::kTenant && access == Access::kUpload) {
    return absl::PermissionDeniedError("uploads take a rank's job token or the admin token");
  }
  if (kind == Kind::kJob && access == Access::kManage) {
    return absl::PermissionDeniedError("listing and deleting take a tenant or the admin token");
  }
  return absl::OkStatus();
}

absl::StatusOr<JobRow> AuthorizeJob(db::Transaction& tx, const Caller& caller,
                                    const std::string& job_id, Access access, int32_t attempt,
                                    JobLock lock) {
  GRADHUB_RETURN_IF_ERROR(CheckKind(caller, access));
  const Kind kind = caller.principal.kind;
  // A job token sees its own job only: any other is NOT_FOUND, as for a tenant, without a read.
  if (kind == Kind::kJob && job_id != caller.principal.job_id) {
    return api::JobNotFound("jobs/" + job_id);
  }
  GRADHUB_ASSIGN_OR_RETURN(JobRow job, ReadJob(tx, job_id, lock));
  if ((kind == Kind::kTenant || kind == Kind::kJob) &&
      job.tenant_id != caller.principal.tenant_id) {
    return api::JobNotFound("jobs/" + job_id);
  }
  if (kind == Kind::kJob && access == Access::kUpload && attempt != caller.principal.attempt) {
    return absl::PermissionDeniedError(
        absl::StrCat("the token of attempt ", caller.principal.attempt, " of jobs/", job_id,
                     " saves checkpoints of that attempt only, not of attempt ", attempt));
  }
  if (access == Access::kUpload) {
    GRADHUB_RETURN_IF_ERROR(CheckAttemptMaySave(job, attempt));
  }
  return job;
}

absl::Status CheckAttemptMaySave(const JobRow& job, int32_t attempt) {
  if (attempt != job.current_attempt) {
    return absl::FailedPreconditionError(
        absl::StrCat("attempt ", attempt, " of jobs/", job.id, " is not its current attempt (",
                     job.current_attempt, "); only the current attempt saves checkpoints"));
  }
  if (job.state != v1::Job::SCHEDULED && job.state != v1::Job::RUNNING &&
      job.state != v1::Job::RESTARTING) {
    return absl::FailedPreconditionError(
        absl::StrCat("jobs/", job.id, " is ", v1::Job::State_Name(job.state),
                     "; checkpoints are saved only while it is SCHEDULED, RUNNING or RESTARTING"));
  }
  return absl::OkStatus();
}

}  // namespace gradhub::checkpoint
