// Who may do what with checkpoints: the rules at the top of proto/gradhub/v1/checkpoint.proto,
// as checks against the job's row, over gRPC and REST alike.
//
//   - Ranks, trainers and scripts alike (job tokens, Principal::Kind::kJob, issued per rank by
//     IssueRankCredential): read their own job's checkpoints and upload those of their own
//     attempt; never list or delete. Any other job is NOT_FOUND, as for a tenant. The token
//     itself names the job and the attempt, and the Authenticator refuses it (never cached)
//     as soon as that attempt is no longer current or the job ended.
//   - The admin token may do everything.
//   - Tenants list, read and delete their own jobs' checkpoints; another tenant's job is
//     NOT_FOUND, exactly like a job that does not exist.
//   - Node tokens (agents) have no checkpoint rights at all: every rank has a credential of its
//     own, so a node token that leaks from an agent reads and writes no job's checkpoints.
// Whoever uploads, only the job's current attempt may, while the job is SCHEDULED, RUNNING or
// RESTARTING (rank 0 of an attempt being stopped saves its last step): a straggler of a failed
// attempt gets FAILED_PRECONDITION.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "gradhub/v1/jobs.pb.h"
#include "services/common/auth/authenticator.h"
#include "services/common/db/pool.h"

namespace gradhub::checkpoint {

// The caller of one request, as the adapters learn it from the call's `authorization`
// metadata (gRPC) or header (REST).
struct Caller {
  api::Principal principal;
};

// Who the caller is for limits per caller (transfer_slots.h): "admin", "tenant:<id>",
// "job:<uuid>" or "node" (node tokens, shared by every agent: code downloads).
std::string CallerKey(const Caller& caller);

// The caller behind `authorization` ("Bearer ..."); UNAUTHENTICATED as the Authenticator says.
absl::StatusOr<Caller> IdentifyCaller(const api::Authenticator& auth,
                                      const std::string& authorization);

enum class Access {
  kUpload,  // StartUpload, UploadChunks, CommitCheckpoint: ranks (job tokens, for their own
            // attempt), admin
  kRead,    // GetLatestCheckpoint, DownloadCheckpoint: ranks (their own job), the job's
            // tenant, admin
  kManage,  // ListCheckpoints, DeleteCheckpoint: the job's tenant, admin
};

// What the store needs of a job's row.
struct JobRow {
  std::string id;  // uuid
  int64_t tenant_id = 0;
  v1::Job::State state = v1::Job::STATE_UNSPECIFIED;
  int32_t current_attempt = 0;
  int32_t keep_last = 3;  // spec checkpoint.keepLast, 0 or absent = 3
};

// OK when `attempt` may save (start or commit) checkpoints of `job`: it is the current attempt
// and the job is SCHEDULED, RUNNING or RESTARTING (an attempt being stopped for a drain, whose
// rank 0 saves the last step it finished on SIGTERM; the next attempt starts only once every
// rank of this one has stopped, so it resumes from that save. The survivors of a rank's failure
// are SIGKILLed instead, nodes.proto heartbeat step 4a: they can finish no step).
// FAILED_PRECONDITION saying why not.
absl::Status CheckAttemptMaySave(const JobRow& job, int32_t attempt);

// How AuthorizeJob locks the job's row for the rest of the caller's transaction.
enum class JobLock { kNone, kShare, kNoKeyUpdate };

// Job `job_id` (a uuid, or "" for a malformed name) in `tx`, or NOT_FOUND. No access check.
absl::StatusOr<JobRow> ReadJobRow(db::Transaction& tx, const std::string& job_id, JobLock lock);

// Reads job `job_id` (a uuid, or "" for a malformed name) in `tx` and checks that `caller` may
// `access` it; `attempt` is the attempt of the upload (kUpload only). NOT_FOUND for a missing
// job, another tenant's, or (job tokens) any job but the token's; PERMISSION_DENIED for a token
// of the wrong kind (CheckKind), or a job token uploading for another attempt than its own;
// FAILED_PRECONDITION for an upload of an attempt that is not the current one, or while the
// job is not SCHEDULED, RUNNING or RESTARTING.
absl::StatusOr<JobRow> AuthorizeJob(db::Transaction& tx, const Caller& caller,
                                    const std::string& job_id, Access access, int32_t attempt,
                                    JobLock lock = JobLock::kNone);

// PERMISSION_DENIED when the caller's kind of token may never `access` (a node token, a tenant
// uploading, a job token listing or deleting), checked before any row is read so that it
// reveals nothing about jobs.
absl::Status CheckKind(const Caller& caller, Access access);

}  // namespace gradhub::checkpoint
