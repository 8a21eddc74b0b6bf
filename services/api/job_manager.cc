#include "services/api/job_manager.h"

#include <google/protobuf/util/time_util.h>

#include <algorithm>
#include <limits>
#include <nlohmann/json.hpp>
#include <regex>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "services/api/job_metrics.h"
#include "services/common/contract/data_paths.h"
#include "services/common/contract/job_states.h"
#include "services/common/contract/proto_json.h"
#include "services/common/job_records.h"
#include "services/common/page_token.h"
#include "services/common/status_macros.h"
#include "services/common/text_rules.h"

namespace gradhub::api {
namespace {

using State = v1::Job::State;
using google::protobuf::util::TimeUtil;

// The names of the lists whose page tokens (page_token.h) this manager makes.
constexpr char kJobsList[] = "jobs";
constexpr char kEventsList[] = "job_events";
constexpr size_t kMaxRequestIdLength = 64;
constexpr size_t kMaxCancelReasonLength = 1024;
// GetJobMetricsRequest.max_points: 0 = the default; more than the maximum is refused, not
// capped, as jobs.proto says "at most".
constexpr int32_t kDefaultMetricPoints = 500;
constexpr int32_t kMaxMetricPoints = 10000;

// The agents stop a cancelled job's ranks once they leave the desired set: its attempt in
// flight ends CANCELLED and every live rank of the job becomes STOPPING (STOPPED once its
// agent reports it gone). Returns how many ranks are still live.
absl::StatusOr<int64_t> StopRanksOfCancelledJob(db::Transaction& tx, const std::string& id) {
  GRADHUB_RETURN_IF_ERROR(tx.Exec("UPDATE job_attempts SET state = 'CANCELLED', end_time = now()"
                                  " WHERE job_id = $1::uuid AND state IN ('SCHEDULED', 'RUNNING')",
                                  {id})
                              .status());
  GRADHUB_RETURN_IF_ERROR(tx.Exec(absl::StrCat("UPDATE rank_assignments SET state = 'STOPPING',"
                                               " update_time = now() WHERE job_id = $1::uuid"
                                               " AND state IN ",
                                               kRunnableRankStatesSql),
                                  {id})
                              .status());
  GRADHUB_ASSIGN_OR_RETURN(db::Result live,
                           tx.Exec("SELECT count(*)::bigint AS n FROM rank_assignments"
                                   " WHERE job_id = $1::uuid AND state = 'STOPPING'",
                                   {id}));
  return live.row(0).Get<int64_t>("n");
}

// The columns JobEventFromRow reads, NULLs as the proto's defaults.
constexpr char kJobEventColumns[] =
    "id, attempt, type, coalesce(from_state, '') AS from_state,"
    " coalesce(to_state, '') AS to_state,"
    " message, coalesce(failure_kind, 'NONE') AS failure_kind,"
    " coalesce(rank, -1) AS rank, coalesce(node, '') AS node,"
    " coalesce(exit_code, 0) AS exit_code, coalesce(signal, 0) AS signal,"
    " coalesce(checkpoint_step, 0) AS checkpoint_step,"
    " coalesce(checkpoint_size_bytes, 0) AS checkpoint_size_bytes,"
    " (extract(epoch FROM create_time) * 1e6)::bigint AS time_us";

v1::JobEvent JobEventFromRow(const db::Row& row, const std::string& job) {
  v1::JobEvent event;
  event.set_id(row.Get<int64_t>("id"));
  event.set_job(job);
  event.set_attempt(row.Get<int32_t>("attempt"));
  *event.mutable_time() = MicrosColumn(row, "time_us");
  v1::JobEvent::Type type = v1::JobEvent::TYPE_UNSPECIFIED;
  v1::JobEvent::Type_Parse(row.Get<std::string>("type"), &type);
  event.set_type(type);
  State state = v1::Job::STATE_UNSPECIFIED;
  if (v1::Job::State_Parse(row.Get<std::string>("from_state"), &state)) {
    event.set_from_state(state);
  }
  if (v1::Job::State_Parse(row.Get<std::string>("to_state"), &state)) event.set_to_state(state);
  event.set_message(row.Get<std::string>("message"));
  v1::JobEvent::FailureKind kind = v1::JobEvent::NONE;
  v1::JobEvent::FailureKind_Parse(row.Get<std::string>("failure_kind"), &kind);
  event.set_failure_kind(kind);
  event.set_rank(row.Get<int32_t>("rank"));
  event.set_node(row.Get<std::string>("node"));
  event.set_exit_code(row.Get<int32_t>("exit_code"));
  event.set_signal(row.Get<int32_t>("signal"));
  event.set_checkpoint_step(row.Get<int64_t>("checkpoint_step"));
  event.set_checkpoint_size_bytes(row.Get<int64_t>("checkpoint_size_bytes"));
  return event;
}

// ListJobEventsRequest.filter (`type=X`, `attempt=N`, ANDed) as SQL conditions on job_events.
absl::Status AppendEventFilter(const std::string& filter, std::string* sql, db::ParamList* params) {
  GRADHUB_ASSIGN_OR_RETURN(std::vector<FilterTerm> terms, ParseListFilter(filter));
  for (const FilterTerm& term : terms) {
    if (term.field == "type") {
      v1::JobEvent::Type type = v1::JobEvent::TYPE_UNSPECIFIED;
      if (!v1::JobEvent::Type_Parse(term.value, &type) || type == v1::JobEvent::TYPE_UNSPECIFIED) {
        return absl::InvalidArgumentError(
            absl::StrCat("filter: type '", term.value, "' is not an event type"));
      }
      absl::StrAppend(sql, " AND type = ", params->Bind(term.value));
    } else if (term.field == "attempt") {
      int32_t attempt = 0;
      if (!absl::SimpleAtoi(term.value, &attempt) || attempt < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("filter: attempt '", term.value, "' is not an attempt number"));
      }
      absl::StrAppend(sql, " AND attempt = ", params->Bind(attempt));
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("filter: unknown field '", term.field, "' (type, attempt)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<v1::Job> JobManager::CreateJob(int64_t tenant_id, const v1::JobSpec& spec,
                                              const std::string& request_id,
                                              std::optional<audit::AuditRecord> event) {
  std::vector<SpecIssue> issues = ValidateJobSpec(spec, limits_);
  GRADHUB_ASSIGN_OR_RETURN(std::vector<SpecIssue> path_issues, CheckSpecPaths(tenant_id, spec));
  issues.insert(issues.end(), path_issues.begin(), path_issues.end());
  if (issues.empty()) {
    GRADHUB_ASSIGN_OR_RETURN(std::optional<SpecIssue> code_issue, CheckScriptCode(tenant_id, spec));
    if (code_issue) issues.push_back(*std::move(code_issue));
  }
  // Refused, not cut: libpq would send "a" for "a\0b", which would then be a retry of "a".
  if (std::string problem = TextLimitProblem(request_id, kMaxRequestIdLength); !problem.empty()) {
    issues.push_back({"request_id", std::move(problem)});
  }
  if (!issues.empty()) {
    std::string message = "invalid job spec:";
    for (const SpecIssue& issue : issues)
      absl::StrAppend(&message, " ", issue.field, ": ", issue.message, ";");
    message.pop_back();
    return absl::InvalidArgumentError(message);
  }
  // Stored as submitted (jobs.proto: "the server does not write defaults into it"); the
  // columns the scheduler reads, and every reader of the spec, apply WithDefaults themselves.
  GRADHUB_ASSIGN_OR_RETURN(std::string json, ProtoToJson(spec));
  const v1::JobSpec effective = WithDefaults(spec);
  NewJob row;
  row.tenant_id = tenant_id;
  row.request_id = request_id;
  row.display_name = spec.display_name();
  row.spec = spec;
  row.spec_json = std::move(json);
  row.priority = effective.priority();
  row.world_size = effective.distributed().world_size();
  row.max_infra_restarts = effective.max_restarts().infrastructure();
  row.max_job_restarts = effective.max_restarts().job();
  row.event = std::move(event);
  if (initial_reason_) {
    GRADHUB_ASSIGN_OR_RETURN(const std::string tenant, TenantName(tenant_id));
    row.state_reason = initial_reason_(effective, tenant);
  }
  absl::StatusOr<v1::Job> created = inserter_.Insert(row);
  if (created.ok() && on_created_) on_created_(*created, effective);
  return created;
}

absl::StatusOr<std::string> JobManager::TenantName(int64_t tenant_id) {
  {
    std::lock_guard<std::mutex> lock(tenant_names_mu_);
    if (const auto it = tenant_names_.find(tenant_id); it != tenant_names_.end()) return it->second;
  }
  GRADHUB_ASSIGN_OR_RETURN(
      db::Result rows,
      pool_->Exec("SELECT 'tenants/' || name AS tenant FROM tenants WHERE id = $1", {tenant_id}));
  if (rows.empty()) return absl::NotFoundError(absl::StrCat("no tenant ", tenant_id));
  std::lock_guard<std::mutex> lock(tenant_names_mu_);
  return tenant_names_[tenant_id] = rows.row(0).Get<std::string>("tenant");
}

absl::StatusOr<std::optional<SpecIssue>> JobManager::CheckScriptCode(int64_t tenant_id,
                                                                     const v1::JobSpec& spec) {
  if (!spec.has_script()) return std::nullopt;
  constexpr absl::string_view kDigestPrefix = "sha256:";
  const std::string hex = spec.script().code().substr(kDigestPrefix.size());
  GRADHUB_ASSIGN_OR_RETURN(
      db::Result rows,
      pool_->Exec("SELECT 1 FROM code_archives WHERE tenant_id = $1 AND sha256 = $2",
                  {tenant_id, hex}));
  if (!rows.empty()) return std::nullopt;
  return SpecIssue{"script.code",
                   absl::StrCat(spec.script().code(),
                                " is no code this tenant uploaded (`gradhub code push DIR` or "
                                "CodeService.UploadCode uploads it)")};
}

absl::StatusOr<std::vector<SpecIssue>> JobManager::CheckSpecPaths(int64_t tenant_id,
                                                                  const v1::JobSpec& spec) {
  const std::vector<SpecPath> paths = SpecPaths(spec);
  std::vector<SpecIssue> issues;
  if (paths.empty()) return issues;  // synthetic data, a built-in model: nothing to serve
  GRADHUB_ASSIGN_OR_RETURN(const std::vector<NodeRoots> nodes, NodeDataRoots());
  // What the tenant may use: every node's shared roots and its own, never another tenant's
  // (which the message below must not list either).
  std::vector<std::string> usable;
  const auto add = [&usable](const std::vector<std::string>& roots) {
    for (const std::string& root : roots) {
      if (std::find(usable.begin(), usable.end(), root) == usable.end()) usable.push_back(root);
    }
  };
  for (const NodeRoots& node : nodes) {
    add(node.shared);
    if (const auto own = node.of_tenant.find(tenant_id); own != node.of_tenant.end()) {
      add(own->second);
    }
  }
  for (const SpecPath& path : paths) {
    if (!IsCleanPath(path.path)) {
      // PathProblem's message for an unclean path names the field and the rule.
      const std::string problem = PathProblem(path, {});
      issues.push_back({path.field, problem.substr(path.field.size() + 2)});
    } else if (!nodes.empty() && !IsUnderAnyRoot(path.path, usable)) {
      issues.push_back({path.field, absl::StrCat(path.path,
                                                 " is under no registered node's "
                                                 "data roots this tenant may use (",
                                                 DescribeRoots(usable), ")")});
    }
  }
  return issues;
}

absl::StatusOr<std::vector<JobManager::NodeRoots>> JobManager::NodeDataRoots() {
  std::lock_guard<std::mutex> lock(roots_mu_);
  const auto now = std::chrono::steady_clock::now();
  if (roots_read_ && now - roots_read_time_ < kNodeRootsMaxAge) return node_roots_;
  // Tenant roots by tenant id: CreateJob knows its caller's id, not its name. A root of a
  // tenant that does not exist (yet) is nobody's.
  GRADHUB_ASSIGN_OR_RETURN(
      db::Result rows,
      pool_->Exec("SELECT n.data_roots::text AS data_roots, coalesce((SELECT"
                  " jsonb_agg(jsonb_build_array(t.id, r->>'path'))"
                  " FROM jsonb_array_elements(n.tenant_data_roots) r"
                  " JOIN tenants t ON 'tenants/' || t.name = r->>'tenant'), '[]')::text"
                  " AS tenant_roots FROM nodes n"));
  node_roots_.clear();
  for (const db::Row& row : rows) {
    NodeRoots& roots = node_roots_.emplace_back();
    for (const auto& root : nlohmann::json::parse(row.Get<std::string>("data_roots"))) {
      roots.shared.push_back(root.get<std::string>());
    }
    for (const auto& root : nlohmann::json::parse(row.Get<std::string>("tenant_roots"))) {
      roots.of_tenant[root[0].get<int64_t>()].push_back(root[1].get<std::string>());
    }
  }
  roots_read_ = true;
  roots_read_time_ = now;
  return node_roots_;
}

absl::StatusOr<v1::Job> JobManager::GetJob(int64_t tenant_id, const std::string& name) {
  return pool_->Transact([&](db::Transaction& tx) { return ReadJob(tx, name, tenant_id, false); },
                         {.read_only = true});
}

absl::StatusOr<v1::ListJobsResponse> JobManager::ListJobs(int64_t tenant_id,
                                                          const v1::ListJobsRequest& request) {
  GRADHUB_ASSIGN_OR_RETURN(const int32_t page_size, ListPageSize(request.page_size()));
  std::string sql = absl::StrCat("SELECT ", kJobColumns,
                                 " FROM jobs j JOIN tenants t ON t.id = j.tenant_id"
                                 " WHERE ($1 < 0 OR j.tenant_id = $1)");
  db::ParamList params = {tenant_id};
  GRADHUB_ASSIGN_OR_RETURN(std::vector<FilterTerm> terms, ParseListFilter(request.filter()));
  for (const FilterTerm& term : terms) {
    if (term.field == "state") {
      State state = v1::Job::STATE_UNSPECIFIED;
      if (!v1::Job::State_Parse(term.value, &state) || state == v1::Job::STATE_UNSPECIFIED) {
        return absl::InvalidArgumentError(
            absl::StrCat("filter: state '", term.value, "' is not a job state"));
      }
      absl::StrAppend(&sql, " AND j.state = ", params.Bind(term.value));
    } else if (auto labels = LabelCondition(term, "j.labels", params)) {
      absl::StrAppend(&sql, " AND ", *labels);
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("filter: unknown field '", term.field, "' (state, labels.KEY)"));
    }
  }
  if (!request.page_token().empty()) {
    // The create time (microseconds since the epoch) and id of the last job of the page before.
    GRADHUB_ASSIGN_OR_RETURN(const std::vector<std::string> key,
                             ReadPageToken(request.page_token(), kJobsList, 2));
    GRADHUB_ASSIGN_OR_RETURN(const int64_t micros, PageTokenInt(key[0], 0, kMaxTimestampMicros));
    const std::string id = JobId("jobs/" + key[1]);
    if (id.empty()) {
      return absl::InvalidArgumentError("page_token: not a token this server returned");
    }
    absl::StrAppend(&sql, " AND (j.create_time, j.id) < (timestamptz 'epoch' + ",
                    params.Bind(micros), " * interval '1 microsecond', ", params.Bind(id),
                    "::uuid)");
  }
  absl::StrAppend(&sql, " ORDER BY j.create_time DESC, j.id DESC LIMIT ",
                  params.Bind(page_size + 1));
  return pool_->Transact(
      [&](db::Transaction& tx) -> absl::StatusOr<v1::ListJobsResponse> {
        GRADHUB_ASSIGN_OR_RETURN(db::Result rows, tx.Exec(sql, params.values()));
        v1::ListJobsResponse response;
        for (int i = 0; i < rows.rows() && i < page_size; ++i) {
          GRADHUB_ASSIGN_OR_RETURN(*response.add_jobs(), JobFromRow(rows.row(i)));
        }
        if (rows.rows() > page_size) {
          const db::Row last = rows.row(page_size - 1);
          response.set_next_page_token(MakePageToken(
              kJobsList,
              {absl::StrCat(last.Get<int64_t>("create_us")), last.Get<std::string>("id")}));
        }
        return response;
      },
      {.read_only = true});
}

absl::StatusOr<v1::Job> JobManager::CancelJob(int64_t tenant_id, const std::string& name,
                                              const std::string& reason) {
  if (const std::string problem = TextLimitProblem(reason, kMaxCancelReasonLength);
      !problem.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("reason: ", problem));
  }
  const std::string why =
      reason.empty() ? "cancelled by the user" : absl::StrCat("cancelled by the user: ", reason);
  absl::StatusOr<v1::Job> cancelled =
      pool_->Transact([&](db::Transaction& tx) -> absl::StatusOr<v1::Job> {
        GRADHUB_ASSIGN_OR_RETURN(v1::Job job, ReadJob(tx, name, tenant_id, true));
        // As jobs.proto says: cancelling a job that already ended, or is being cancelled, returns
        // it unchanged.
        if (IsTerminal(job.state()) || job.state() == v1::Job::CANCELLING) return job;
        const std::string id = JobId(name);
        GRADHUB_RETURN_IF_ERROR(
            tx.Exec("UPDATE jobs SET cancel_requested = true WHERE id = $1::uuid", {id}).status());
        GRADHUB_RETURN_IF_ERROR(AppendEvent(tx, id, job.attempt(), v1::JobEvent::CANCEL_REQUESTED,
                                            std::nullopt, std::nullopt, Because(reason)));
        GRADHUB_ASSIGN_OR_RETURN(const int64_t live, StopRanksOfCancelledJob(tx, id));
        const State next = StateAfterCancel(job.state(), live);
        return ApplyTransition(
            tx, job, next,
            Because(next == v1::Job::CANCELLING
                        ? absl::StrCat(why, "; stopping ", live, live == 1 ? " rank" : " ranks")
                        : why));
      });
  if (cancelled.ok() && on_cancelled_) on_cancelled_();
  return cancelled;
}

absl::StatusOr<v1::Job> JobManager::Transition(const std::string& name, State to,
                                               const EventDetails& details) {
  return pool_->Transact([&](db::Transaction& tx) -> absl::StatusOr<v1::Job> {
    GRADHUB_ASSIGN_OR_RETURN(v1::Job job, ReadJob(tx, name, -1, true));
    return ApplyTransition(tx, job, to, details);
  });
}

absl::Status JobManager::CheckReady() {
  // Within kReadinessBudget whatever the database does: at once while the pool knows it to be
  // unreachable (pool.h), else one query given the budget in all. A database that has just gone
  // silent is known to be only when a connection times out (silence_timeout), later than a
  // probe waits for its answer.
  auto applied =
      pool_->ExecWithin(kReadinessBudget, "SELECT count(*)::bigint AS n FROM schema_migrations");
  if (applied.status().code() == absl::StatusCode::kDeadlineExceeded) {
    return absl::UnavailableError(absl::StrCat("the database did not answer within ",
                                               absl::FormatDuration(kReadinessBudget)));
  }
  if (!applied.ok()) return absl::UnavailableError(applied.status().message());
  if (applied->row(0).Get<int64_t>("n") == 0) {
    return absl::UnavailableError("no migrations applied");
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::ListJobEventsResponse> JobManager::ListJobEvents(
    int64_t tenant_id, const v1::ListJobEventsRequest& request) {
  GRADHUB_ASSIGN_OR_RETURN(const int32_t page_size, ListPageSize(request.page_size()));
  std::string sql =
      absl::StrCat("SELECT ", kJobEventColumns, " FROM job_events WHERE job_id = $1::uuid");
  db::ParamList params = {JobId(request.parent())};
  GRADHUB_RETURN_IF_ERROR(AppendEventFilter(request.filter(), &sql, &params));
  if (!request.page_token().empty()) {
    // The id of the last event of the previous page: ids only grow, so pages never shift.
    GRADHUB_ASSIGN_OR_RETURN(const std::vector<std::string> key,
                             ReadPageToken(request.page_token(), kEventsList, 1));
    GRADHUB_ASSIGN_OR_RETURN(const int64_t after,
                             PageTokenInt(key[0], 0, std::numeric_limits<int64_t>::max()));
    absl::StrAppend(&sql, " AND id > ", params.Bind(after), "::bigint");
  }
  absl::StrAppend(&sql, " ORDER BY id LIMIT ", params.Bind(page_size + 1));
  return pool_->Transact(
      [&](db::Transaction& tx) -> absl::StatusOr<v1::ListJobEventsResponse> {
        GRADHUB_ASSIGN_OR_RETURN(v1::Job job, ReadJob(tx, request.parent(), tenant_id, false));
        GRADHUB_ASSIGN_OR_RETURN(db::Result rows, tx.Exec(sql, params.values()));
        v1::ListJobEventsResponse events;
        for (int i = 0; i < rows.rows() && i < page_size; ++i) {
          *events.add_events() = JobEventFromRow(rows.row(i), job.name());
        }
        if (rows.rows() > page_size) {
          events.set_next_page_token(
              MakePageToken(kEventsList, {absl::StrCat(events.events(page_size - 1).id())}));
        }
        return events;
      },
      {.read_only = true});
}

absl::StatusOr<JobManager::LogPage> JobManager::ReadLogs(
    int64_t tenant_id, const std::string& name, int32_t attempt, int32_t rank,
    const std::map<int32_t, int64_t>& after_seq, int64_t after_seq_default, int32_t limit) {
  std::string cursor = "{";
  for (const auto& [r, seq] : after_seq) {
    absl::StrAppend(&cursor, cursor.size() > 1 ? "," : "", "\"", r, "\":", seq);
  }
  cursor += "}";
  return pool_->Transact(
      [&](db::Transaction& tx) -> absl::StatusOr<LogPage> {
        LogPage page;
        GRADHUB_ASSIGN_OR_RETURN(page.job, ReadJob(tx, name, tenant_id, false));
        page.attempt = attempt > 0 ? attempt : page.job.attempt();
        GRADHUB_ASSIGN_OR_RETURN(
            db::Result rows,
            tx.Exec("SELECT rank, stream, seq, line,"
                    " (extract(epoch FROM create_time) * 1e6)::bigint AS time_us"
                    " FROM job_logs WHERE job_id = $1::uuid AND attempt = $2"
                    " AND ($3 < 0 OR rank = $3)"
                    " AND seq > coalesce(($4::jsonb ->> rank::text)::bigint, $5)"
                    " ORDER BY create_time, rank, seq LIMIT $6",
                    {JobId(name), page.attempt, rank, cursor, after_seq_default, limit}));
        for (const db::Row& row : rows) {
          v1::LogEntry& line = page.lines.emplace_back();
          line.set_attempt(page.attempt);
          line.set_rank(row.Get<int32_t>("rank"));
          line.set_stream(row.Get<std::string>("stream") == "STDERR" ? v1::LogEntry::STDERR
                                                                     : v1::LogEntry::STDOUT);
          line.set_seq(row.Get<int64_t>("seq"));
          *line.mutable_time() = MicrosColumn(row, "time_us");
          line.set_text(row.Get<std::string>("line"));
        }
        return page;
      },
      {.read_only = true});
}

absl::StatusOr<v1::JobMetrics> JobManager::GetJobMetrics(int64_t tenant_id,
                                                         const v1::GetJobMetricsRequest& request) {
  if (request.max_points() < 0 || request.max_points() > kMaxMetricPoints) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_points: ", request.max_points(), " is not between 0 (the default, ",
                     kDefaultMetricPoints, ") and ", kMaxMetricPoints));
  }
  const int32_t max_points =
      request.max_points() == 0 ? kDefaultMetricPoints : request.max_points();
  return pool_->Transact(
      [&](db::Transaction& tx) -> absl::StatusOr<v1::JobMetrics> {
        GRADHUB_ASSIGN_OR_RETURN(const v1::Job job, ReadJob(tx, request.name(), tenant_id, false));
        return ReadJobMetrics(tx, job, static_cast<size_t>(max_points));
      },
      {.read_only = true});
}

absl::Status JobManager::WatchJob(int64_t tenant_id, const std::string& name,
                                  const std::function<bool(const v1::Job&)>& send,
                                  const std::function<bool()>& stop) {
  std::string sent_etag;
  while (!stop()) {
    GRADHUB_ASSIGN_OR_RETURN(const v1::Job job, GetJob(tenant_id, name));
    if (job.etag() != sent_etag) {
      if (!send(job)) return absl::CancelledError("client gone");
      sent_etag = job.etag();
    }
    if (IsTerminal(job.state())) return absl::OkStatus();
    std::this_thread::sleep_for(kPollInterval);
  }
  return absl::CancelledError("client cancelled");
}

absl::Status JobManager::StreamLogs(int64_t tenant_id, const v1::GetJobLogsRequest& request,
                                    const std::function<bool(const v1::LogEntry&)>& send,
                                    const std::function<bool()>& stop) {
  constexpr int32_t kPage = 1000;
  const int32_t rank = request.has_rank() ? request.rank() : -1;
  std::map<int32_t, int64_t> after;
  int32_t attempt = request.attempt();
  while (!stop()) {
    GRADHUB_ASSIGN_OR_RETURN(const LogPage page, ReadLogs(tenant_id, request.name(), attempt, rank,
                                                          after, request.after_seq(), kPage));
    attempt = page.attempt;
    for (const v1::LogEntry& line : page.lines) {
      if (!send(line)) return absl::CancelledError("client gone");
      after[line.rank()] = line.seq();
    }
    if (static_cast<int32_t>(page.lines.size()) == kPage) continue;
    // Lines arrive after the job ends (agents flush), so a follower leaves once the job has
    // ended and a read found nothing new.
    if (!request.follow() || (IsTerminal(page.job.state()) && page.lines.empty())) {
      return absl::OkStatus();
    }
    std::this_thread::sleep_for(kPollInterval);
  }
  return absl::CancelledError("client cancelled");
}

}  // namespace gradhub::api
