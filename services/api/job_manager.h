// The job API's domain logic: validation, the job lifecycle and its SQL. The gRPC and REST
// adapters both call it and add nothing but transport; every state change is one transaction
// that checks the current state, updates the job and appends to job_events.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "gradhub/v1/jobs.pb.h"
#include "services/api/job_inserter.h"
#include "services/common/contract/job_spec.h"
#include "services/common/db/pool.h"
#include "services/common/job_records.h"

namespace gradhub::api {

// Thread-safe: every method may be called from any thread at once (gRPC's and the REST
// gateway's request threads). Each call runs its statements on its own pooled connection;
// PostgreSQL's transactions order them. The only state here is the cache of the nodes' data
// roots, under roots_mu_. Streams (WatchJob, StreamLogs) block their calling thread until done.
class JobManager {
 public:
  JobManager(db::Pool* pool, SpecLimits limits, JobInserterOptions inserts = {})
      : pool_(pool), limits_(limits), inserter_(pool, inserts) {}

  // Told after a job was created (the job and its spec with defaults: main hands them to the
  // scheduler's fast path) and
  // after one was cancelled (its ranks are no longer desired: main nudges the scheduler and
  // wakes the agents). Set before the first call; empty = nobody to tell.
  void set_on_created(std::function<void(const v1::Job& job, const v1::JobSpec& spec)> on_created) {
    on_created_ = std::move(on_created);
  }
  void set_on_cancelled(std::function<void()> on_cancelled) {
    on_cancelled_ = std::move(on_cancelled);
  }
  // Asked before a job is stored for the reason it waits with (main: the scheduler's
  // ReasonForNewJob), from its spec with defaults and its tenant (tenants/NAME). Set before the
  // first call; empty, or an empty answer = none yet: the scheduler's next pass gives it one.
  void set_initial_reason(
      std::function<std::string(const v1::JobSpec&, const std::string&)> reason) {
    initial_reason_ = std::move(reason);
  }

  // INVALID_ARGUMENT naming every bad field, including every file path the spec names
  // (data_paths.h) that is not clean or lies under no registered node's data roots that the
  // tenant may use (shared ones and its own tenant_data_roots, never another's). While no
  // node is registered at all, paths are only checked for form: the api cannot know what will
  // serve them, and the job waits PENDING (the scheduler places it only on a node whose roots
  // hold its paths, and says so in its state reason). Idempotent per (tenant, request_id): a retry
  // returns the job the first call made, and ALREADY_EXISTS when it asks for another spec.
  // Concurrent creates share a commit (JobInserter). `event`: the call's audit event
  // (CallAuditor::EventOf), which an OK outcome writes with the job, or, for a retry, with the
  // look-up of the job the first call made (AuditedRpc::ok_event_written_by_handler).
  absl::StatusOr<v1::Job> CreateJob(int64_t tenant_id, const v1::JobSpec& spec,
                                    const std::string& request_id,
                                    std::optional<audit::AuditRecord> event = std::nullopt);

  // tenant_id < 0 (the admin token) = any tenant, for every call but CreateJob.
  // `name` is "jobs/{id}". Another tenant's job is NOT_FOUND, as a job that does not exist.
  absl::StatusOr<v1::Job> GetJob(int64_t tenant_id, const std::string& name);

  // Newest first, paged by keyset (a page token names the last job returned, so pages stay
  // stable while jobs are added). INVALID_ARGUMENT for a bad page_size, page_token or filter,
  // naming it.
  absl::StatusOr<v1::ListJobsResponse> ListJobs(int64_t tenant_id,
                                                const v1::ListJobsRequest& request);

  // Idempotent: cancelling a job that already ended (cancelled, succeeded or failed) or is
  // CANCELLING returns it unchanged. A job without live ranks becomes CANCELLED at once; one
  // with ranks becomes CANCELLING, and the scheduler makes it CANCELLED once its agents have
  // reported every rank gone (scheduler.h, step 3), so CANCELLED means no process is left.
  // `reason` (at most 1024 characters) goes into the CANCEL_REQUESTED event and the state reason.
  absl::StatusOr<v1::Job> CancelJob(int64_t tenant_id, const std::string& name,
                                    const std::string& reason = "");

  // For the scheduler and agents (no tenant check). FAILED_PRECONDITION, with nothing
  // written, when the job's current state does not allow it.
  absl::StatusOr<v1::Job> Transition(const std::string& name, v1::Job::State to,
                                     const EventDetails& details = {});

  // OK when the database answers and the schema has been migrated; for /readyz. UNAVAILABLE
  // otherwise, always within kReadinessBudget: a probe's own timeout is usually a second.
  static constexpr absl::Duration kReadinessBudget = absl::Milliseconds(800);
  absl::Status CheckReady();

  // Oldest first (id order), paged by id; filter terms: type, attempt.
  absl::StatusOr<v1::ListJobEventsResponse> ListJobEvents(int64_t tenant_id,
                                                          const v1::ListJobEventsRequest& request);

  // Up to `limit` lines of one attempt (0 = the job's current one), oldest first, of one rank
  // (rank < 0 = all), each with a seq above after_seq[rank] (missing = after_seq_default).
  // Also returns the job, so a follower knows when it has ended.
  struct LogPage {
    v1::Job job;
    int32_t attempt = 0;
    std::vector<v1::LogEntry> lines;
  };
  absl::StatusOr<LogPage> ReadLogs(int64_t tenant_id, const std::string& name, int32_t attempt,
                                   int32_t rank, const std::map<int32_t, int64_t>& after_seq,
                                   int64_t after_seq_default, int32_t limit);

  // The job's training history (job_metrics.h), downsampled to request.max_points (0 = 500,
  // at most 10000; INVALID_ARGUMENT naming max_points otherwise). Tenants as in GetJob.
  absl::StatusOr<v1::JobMetrics> GetJobMetrics(int64_t tenant_id,
                                               const v1::GetJobMetricsRequest& request);

  // How often WatchJob and StreamLogs look for changes.
  static constexpr std::chrono::milliseconds kPollInterval{200};

  // Calls `send` with the job as it is now, then with every new version (a slow reader may
  // skip some, never the latest), until the job ends (OK after sending it), `send` returns
  // false or `stop()` is true (CANCELLED).
  absl::Status WatchJob(int64_t tenant_id, const std::string& name,
                        const std::function<bool(const v1::Job&)>& send,
                        const std::function<bool()>& stop);

  // Calls `send` with each stored line of `request`'s attempt, oldest first; with follow, also
  // the lines that arrive later, until the attempt's job has ended and its last lines are in.
  // The follower stays on the attempt it started with. Same returns as WatchJob.
  absl::Status StreamLogs(int64_t tenant_id, const v1::GetJobLogsRequest& request,
                          const std::function<bool(const v1::LogEntry&)>& send,
                          const std::function<bool()>& stop);

 private:
  // The path issues of CreateJob (see there), against the roots the tenant may use.
  absl::StatusOr<std::vector<SpecIssue>> CheckSpecPaths(int64_t tenant_id, const v1::JobSpec& spec);
  // A script job's code must be an archive its tenant uploaded (code_archives): another
  // tenant's digest is refused like one that does not exist.
  absl::StatusOr<std::optional<SpecIssue>> CheckScriptCode(int64_t tenant_id,
                                                           const v1::JobSpec& spec);
  // One registered node's data roots: those every tenant may use (Node.data_roots), and each
  // tenant's own (Node.tenant_data_roots) by tenant id.
  struct NodeRoots {
    std::vector<std::string> shared;
    std::map<int64_t, std::vector<std::string>> of_tenant;
  };
  // Every registered node's data roots (one entry per node), read at most every
  // kNodeRootsMaxAge: a registration takes effect for CreateJob that much later, and a burst
  // of CreateJobs costs no extra query each.
  absl::StatusOr<std::vector<NodeRoots>> NodeDataRoots();
  static constexpr std::chrono::milliseconds kNodeRootsMaxAge{1000};

  db::Pool* pool_;
  SpecLimits limits_;
  JobInserter inserter_;
  std::function<void(const v1::Job&, const v1::JobSpec&)> on_created_;
  std::function<void()> on_cancelled_;
  std::function<std::string(const v1::JobSpec&, const std::string&)> initial_reason_;
  // tenants/NAME by tenant id, for initial_reason_: a tenant's name never changes.
  absl::StatusOr<std::string> TenantName(int64_t tenant_id);
  std::mutex tenant_names_mu_;
  std::map<int64_t, std::string> tenant_names_;  // guarded by tenant_names_mu_
  std::mutex roots_mu_;
  bool roots_read_ = false;                                // guarded by roots_mu_
  std::chrono::steady_clock::time_point roots_read_time_;  // guarded by roots_mu_
  std::vector<NodeRoots> node_roots_;                      // guarded by roots_mu_
};

}  // namespace gradhub::api
