// Group commit for new jobs: CreateJob calls that arrive while earlier ones are being written
// share one statement and one durable commit. A create is one row and one event, so under load
// a transaction's fixed costs (round trips, BEGIN/COMMIT, the WAL flush, the waits in between)
// were most of what a create cost PostgreSQL; sharing them is what lets the rate exceed the
// number of commits the disk can do, without ever answering before the commit.
#pragma once

#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "gradhub/v1/jobs.pb.h"
#include "services/common/audit/audit_log.h"
#include "services/common/db/pool.h"

namespace gradhub::api {

// One validated job, as the jobs row stores it.
struct NewJob {
  int64_t tenant_id = 0;
  std::string request_id;  // "" = none: never a retry of anything
  std::string display_name;
  v1::JobSpec spec;       // with defaults applied, as returned
  std::string spec_json;  // the same in the proto3 JSON mapping, as stored
  int32_t priority = 0;
  int32_t world_size = 0;
  int32_t max_infra_restarts = 0;
  int32_t max_job_restarts = 0;
  std::string state_reason;  // why it waits, when known at once (Scheduler::ReasonForNewJob)
  // The CreateJob call's audit event (CallAuditor::EventOf), written with the job, its
  // resource the new job's name; none = no event (a caller that is not an audited call).
  std::optional<audit::AuditRecord> event;
};

struct JobInserterOptions {
  // Rows per statement. Past a few dozen the statement's own cost dominates and nothing more
  // is shared; the bound also caps the distinct statement texts prepared per connection.
  int max_batch = 32;
  // Batches written at the same time, each on its own connection. One is best on a small
  // machine: batches are larger, and PostgreSQL spent 0.27 ms of CPU per create with one,
  // 0.36 with two, 0.42 with three and 0.49 with six (tests/bench/create_jobs, 2 cores), at a
  // higher rate with one. A batch then waits for at most one other, a few milliseconds.
  int max_concurrent_batches = 1;
};

// Thread-safe. No thread of its own and no delay: the first caller to find a free batch slot
// writes everything queued at that moment (leader/follower, as PostgreSQL's own WAL group
// commit), so a lone request is written at once and a batch forms only when requests queue.
class JobInserter {
 public:
  JobInserter(db::Pool* pool, JobInserterOptions options = {});

  // Blocks until the job is committed, then returns it as stored. A (tenant, request_id) that
  // already has a job returns that job when its spec is the same, ALREADY_EXISTS otherwise.
  // The job's event, if any, is committed with it; a retry's, which made no job, is not
  // written: `event_written` says which.
  // Each caller gets its own row's outcome: a row the database refuses (e.g. a tenant deleted
  // meanwhile) fails alone, the rest of its batch is written one by one. A lost connection is
  // retried without making a job twice; UNAVAILABLE once the database stays out of reach.
  absl::StatusOr<v1::Job> Insert(const NewJob& job);

  struct Stats {
    int64_t rows = 0;     // taken into batches
    int64_t batches = 0;  // rows / batches is the grouping achieved
    int64_t queued = 0;   // waiting now for a batch slot
  };
  Stats stats() const;

 private:
  struct Request;

  // Each job's outcome, in order: together, or one by one when together failed for what may
  // be one row's fault.
  std::vector<absl::StatusOr<v1::Job>> Write(const std::vector<const NewJob*>& jobs);
  // All of `jobs` in one statement, then a lookup for each row it skipped. An error means
  // nothing was written; otherwise `results` holds each job's own outcome.
  absl::Status WriteTogether(const std::vector<const NewJob*>& jobs,
                             std::vector<absl::StatusOr<v1::Job>>& results);

  db::Pool* const pool_;
  const JobInserterOptions options_;

  mutable std::mutex mu_;
  std::deque<Request*> queue_;  // waiting for a batch, oldest first
  int writing_ = 0;             // batches in flight
  Stats stats_;
};

}  // namespace gradhub::api
