// The SQL primitives of jobs that JobManager, NodeManager and the Scheduler share: reading a
// job row, appending to its history, and the one way a job changes state. Each runs inside a
// caller's transaction, so a caller composes them into one atomic change. The checkpoint store
// uses them too (a checkpoint's job, its events, list filters and paging). The namespace stays
// gradhub::api, the owner of the jobs tables.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <google/protobuf/timestamp.pb.h>

#include "absl/status/statusor.h"
#include "gradhub/v1/jobs.pb.h"
#include "services/common/contract/job_states.h"
#include "services/common/db/pool.h"

namespace gradhub::api {

// What an event row records besides the state change itself.
struct EventDetails {
  std::string message;
  v1::JobEvent::FailureKind failure_kind = v1::JobEvent::NONE;
  int32_t rank = -1;  // -1 = not about one rank
  std::string node;
  int32_t exit_code = 0;
  int32_t signal = 0;
  // For checkpoint events: the checkpoint's step and size (-1 = not about a checkpoint).
  int64_t checkpoint_step = -1;
  int64_t checkpoint_size_bytes = -1;
};

EventDetails Because(std::string message);

// Whether the lifecycle (docs/architecture.md, job_state_transitions) allows `from -> to`.
bool IsAllowedTransition(v1::Job::State from, v1::Job::State to);

// Where CancelJob takes a job in `state` that has `live_ranks` ranks not yet reported gone:
// CANCELLING while any is live (it becomes CANCELLED when the last one is gone), CANCELLED
// when none is, and unchanged for a job already CANCELLING or terminal.
v1::Job::State StateAfterCancel(v1::Job::State state, int64_t live_ranks);

// "jobs/{uuid}" -> the uuid, or "" when the name is not one (then the job does not exist: a
// malformed id must not reach SQL as a cast error).
std::string JobId(const std::string& name);

absl::Status JobNotFound(const std::string& name);

google::protobuf::Timestamp MicrosColumn(const db::Row& row, const char* column);

// One job in `tx`, its row locked when `for_update`; tenant_id < 0 = any tenant. NOT_FOUND
// for another tenant's job exactly as for a missing one.
absl::StatusOr<v1::Job> ReadJob(db::Transaction& tx, const std::string& name, int64_t tenant_id,
                                bool for_update);

// Appends to the job's history; `to` is the new state of a STATE_CHANGED event, unset for
// events that change no state (RANK_FAILED, NODE_LOST, ...).
absl::Status AppendEvent(db::Transaction& tx, const std::string& job_id, int32_t attempt,
                         v1::JobEvent::Type type, std::optional<v1::Job::State> from,
                         std::optional<v1::Job::State> to, const EventDetails& details);

// Moves `job` (read FOR UPDATE in `tx`) to `to` with its event and returns it as stored, or
// FAILED_PRECONDITION with nothing written.
absl::StatusOr<v1::Job> ApplyTransition(db::Transaction& tx, const v1::Job& job, v1::Job::State to,
                                        const EventDetails& details);

// SELECT list for ReadJob-compatible rows (`j` = jobs, `t` = tenants), and the conversion;
// kJobStateColumns and with_spec = false leave the spec out, for callers that have it (parsing
// it back from JSON was a fifth of the api's CPU in a create).
extern const char kJobColumns[];
extern const char kJobStateColumns[];
absl::StatusOr<v1::Job> JobFromRow(const db::Row& row, bool with_spec = true);

// One term of a List* filter (`state=RUNNING AND labels.owner="Ann Lee"`).
struct FilterTerm {
  std::string field;
  std::string value;
};
// INVALID_ARGUMENT naming the position of a malformed filter.
absl::StatusOr<std::vector<FilterTerm>> ParseListFilter(const std::string& filter);

// For a `labels.KEY=VALUE` term, the condition on the jsonb `column` (e.g. "j.labels") with its
// values bound in `params`; nullopt for a term about another field.
std::optional<std::string> LabelCondition(const FilterTerm& term, const std::string& column,
                                          db::ParamList& params);

// The page size of every List* call: 0 = 50, at most 1000, negative INVALID_ARGUMENT.
absl::StatusOr<int32_t> ListPageSize(int32_t requested);

}  // namespace gradhub::api
