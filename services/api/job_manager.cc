#include "services/api/job_manager.h"

#include <google/protobuf/util/json_util.h>
#include <google/protobuf/util/time_util.h>

#include <algorithm>
#include <regex>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "services/common/status_macros.h"

namespace gradhub::api {
namespace {

using State = v1::Job::State;
using google::protobuf::util::TimeUtil;

// Columns every job read selects, timestamps as microseconds since the epoch.
constexpr char kJobColumns[] =
    "j.id::text AS id, t.name AS tenant, j.spec::text AS spec, j.state, j.state_reason,"
    " j.current_attempt, j.infra_restarts, j.job_restarts, j.progress_step,"
    " j.progress_total_steps,"
    " (extract(epoch FROM j.create_time) * 1e6)::bigint AS create_us,"
    " (extract(epoch FROM j.update_time) * 1e6)::bigint AS update_us,"
    " (extract(epoch FROM j.start_time) * 1e6)::bigint AS start_us,"
    " (extract(epoch FROM j.end_time) * 1e6)::bigint AS end_us";

// "jobs/{uuid}" -> the uuid, or "" when the name is not one (then the job does not exist:
// a malformed id must not reach SQL as a cast error).
std::string JobId(const std::string& name) {
  static const std::regex kName(
      "jobs/([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})");
  std::smatch match;
  return std::regex_match(name, match, kName) ? match[1].str() : "";
}

EventDetails Because(std::string message) {
  EventDetails details;
  details.message = std::move(message);
  return details;
}

absl::Status NotFound(const std::string& name) {
  return absl::NotFoundError(absl::StrCat("job '", name, "' not found"));
}

google::protobuf::Timestamp Micros(const db::Row& row, const char* column) {
  return TimeUtil::MicrosecondsToTimestamp(row.Get<int64_t>(column));
}

absl::StatusOr<v1::Job> JobFromRow(const db::Row& row) {
  v1::Job job;
  job.set_name("jobs/" + row.Get<std::string>("id"));
  job.set_tenant("tenants/" + row.Get<std::string>("tenant"));
  const auto parsed =
      google::protobuf::util::JsonStringToMessage(row.Get<std::string>("spec"), job.mutable_spec());
  if (!parsed.ok()) return absl::InternalError(absl::StrCat("stored spec: ", parsed.ToString()));
  State state = v1::Job::STATE_UNSPECIFIED;
  v1::Job::State_Parse(row.Get<std::string>("state"), &state);
  job.set_state(state);
  job.set_state_reason(row.Get<std::string>("state_reason"));
  job.set_attempt(row.Get<int32_t>("current_attempt"));
  job.set_infrastructure_restarts(row.Get<int32_t>("infra_restarts"));
  job.set_job_restarts(row.Get<int32_t>("job_restarts"));
  job.mutable_progress()->set_step(row.Get<int64_t>("progress_step"));
  job.mutable_progress()->set_total_steps(row.Get<int64_t>("progress_total_steps"));
  *job.mutable_create_time() = Micros(row, "create_us");
  *job.mutable_update_time() = Micros(row, "update_us");
  if (!row.IsNull("start_us")) *job.mutable_start_time() = Micros(row, "start_us");
  if (!row.IsNull("end_us")) *job.mutable_end_time() = Micros(row, "end_us");
  return job;
}

// Reads one job inside `tx`, locking its row when `for_update`; tenant_id < 0 = any tenant.
absl::StatusOr<v1::Job> ReadJob(db::Transaction& tx, const std::string& name, int64_t tenant_id,
                                bool for_update) {
  const std::string id = JobId(name);
  if (id.empty()) return NotFound(name);
  GRADHUB_ASSIGN_OR_RETURN(db::Result result,
                   tx.Exec(absl::StrCat("SELECT ", kJobColumns,
                                        " FROM jobs j JOIN tenants t ON t.id = j.tenant_id"
                                        " WHERE j.id = $1::uuid AND ($2::bigint < 0 OR"
                                        " j.tenant_id = $2::bigint)",
                                        for_update ? " FOR UPDATE OF j" : ""),
                           {id, tenant_id}));
  if (result.empty()) return NotFound(name);
  return JobFromRow(result.row(0));
}

absl::Status AppendEvent(db::Transaction& tx, const std::string& job_id, int32_t attempt,
                         v1::JobEvent::Type type, std::optional<State> from, State to,
                         const EventDetails& details) {
  const auto failure = details.failure_kind == v1::JobEvent::NONE
                           ? std::optional<std::string>()
                           : v1::JobEvent::FailureKind_Name(details.failure_kind);
  return tx
      .Exec("INSERT INTO job_events (job_id, attempt, type, from_state, to_state, message,"
            " failure_kind, rank, node, exit_code, signal)"
            " VALUES ($1::uuid, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
            {job_id, attempt, v1::JobEvent::Type_Name(type),
             from ? db::Param(v1::Job::State_Name(*from)) : db::Param(std::nullopt),
             v1::Job::State_Name(to), details.message,
             failure ? db::Param(*failure) : db::Param(std::nullopt),
             details.rank >= 0 ? db::Param(details.rank) : db::Param(std::nullopt),
             details.node.empty() ? db::Param(std::nullopt) : db::Param(details.node),
             details.exit_code != 0 ? db::Param(details.exit_code) : db::Param(std::nullopt),
             details.signal != 0 ? db::Param(details.signal) : db::Param(std::nullopt)})
      .status();
}

// Moves a job read FOR UPDATE in `tx` to `to`, with its event, or refuses.
absl::StatusOr<v1::Job> ApplyTransition(db::Transaction& tx, const v1::Job& job, State to,
                                        const EventDetails& details) {
  if (!IsAllowedTransition(job.state(), to)) {
    return absl::FailedPreconditionError(
        absl::StrCat(job.name(), " is ", v1::Job::State_Name(job.state()), "; it cannot become ",
                     v1::Job::State_Name(to)));
  }
  const std::string id = JobId(job.name());
  GRADHUB_RETURN_IF_ERROR(tx.Exec("UPDATE jobs SET state = $2, state_reason = $3, version = version + 1,"
                          " update_time = now(),"
                          " start_time = CASE WHEN $2 = 'RUNNING' THEN coalesce(start_time, now())"
                          "   ELSE start_time END,"
                          " end_time = CASE WHEN $2 IN ('SUCCEEDED', 'FAILED', 'CANCELLED')"
                          "   THEN now() ELSE NULL END"
                          " WHERE id = $1::uuid",
                          {id, v1::Job::State_Name(to), details.message})
                      .status());
  GRADHUB_RETURN_IF_ERROR(AppendEvent(tx, id, job.attempt(), v1::JobEvent::STATE_CHANGED, job.state(), to,
                              details));
  return ReadJob(tx, job.name(), -1, false);
}

constexpr int32_t kDefaultPageSize = 50;
constexpr size_t kMaxRequestIdLength = 64;
constexpr int32_t kMaxPageSize = 1000;

// One term of a ListJobs filter, e.g. `state=RUNNING` or `labels.owner="Ann Lee"`.
struct FilterTerm {
  std::string field;
  std::string value;
};

absl::StatusOr<std::vector<FilterTerm>> ParseFilter(const std::string& filter) {
  std::vector<FilterTerm> terms;
  size_t pos = 0;
  while (pos < filter.size()) {
    const size_t eq = filter.find('=', pos);
    if (eq == std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("filter: expected field=value at '", filter.substr(pos), "'"));
    }
    FilterTerm term{filter.substr(pos, eq - pos), ""};
    size_t end;
    if (eq + 1 < filter.size() && filter[eq + 1] == '"') {
      const size_t close = filter.find('"', eq + 2);
      if (close == std::string::npos) {
        return absl::InvalidArgumentError("filter: unterminated quoted value");
      }
      term.value = filter.substr(eq + 2, close - eq - 2);
      end = close + 1;
    } else {
      end = filter.find(' ', eq + 1);
      if (end == std::string::npos) end = filter.size();
      term.value = filter.substr(eq + 1, end - eq - 1);
    }
    terms.push_back(std::move(term));
    if (end == filter.size()) break;
    if (filter.compare(end, 5, " AND ") != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("filter: expected ' AND ' at '", filter.substr(end), "'"));
    }
    pos = end + 5;
  }
  return terms;
}

}  // namespace

bool IsAllowedTransition(State from, State to) {
  switch (from) {
    case v1::Job::PENDING:
      return to == v1::Job::SCHEDULED || to == v1::Job::FAILED || to == v1::Job::CANCELLED;
    case v1::Job::SCHEDULED:
      return to == v1::Job::RUNNING || to == v1::Job::RESTARTING || to == v1::Job::FAILED ||
             to == v1::Job::CANCELLED;
    case v1::Job::RUNNING:
      return to == v1::Job::SUCCEEDED || to == v1::Job::FAILED || to == v1::Job::CANCELLED ||
             to == v1::Job::RESTARTING;
    case v1::Job::RESTARTING:
      return to == v1::Job::SCHEDULED || to == v1::Job::FAILED || to == v1::Job::CANCELLED;
    default:
      return false;
  }
}

absl::StatusOr<v1::Job> JobManager::CreateJob(int64_t tenant_id, const v1::JobSpec& spec,
                                              const std::string& request_id) {
  std::vector<SpecIssue> issues = ValidateJobSpec(spec, limits_);
  if (request_id.size() > kMaxRequestIdLength) {
    issues.push_back({"request_id", absl::StrCat("at most ", kMaxRequestIdLength, " characters")});
  }
  if (!issues.empty()) {
    std::string message = "invalid job spec:";
    for (const SpecIssue& issue : issues) absl::StrAppend(&message, " ", issue.field, ": ", issue.message, ";");
    message.pop_back();
    return absl::InvalidArgumentError(message);
  }
  const v1::JobSpec stored = WithDefaults(spec);
  std::string json;
  google::protobuf::util::JsonPrintOptions print;
  print.preserve_proto_field_names = false;
  if (auto status = google::protobuf::util::MessageToJsonString(stored, &json, print); !status.ok()) {
    return absl::InternalError(status.ToString());
  }
  return pool_->Transact([&](db::Transaction& tx) -> absl::StatusOr<v1::Job> {
    GRADHUB_ASSIGN_OR_RETURN(
        db::Result inserted,
        tx.Exec("INSERT INTO jobs (tenant_id, request_id, display_name, labels, spec, priority,"
                " world_size, max_infra_restarts, max_job_restarts)"
                " VALUES ($1, $2, $3, coalesce($4::jsonb -> 'labels', '{}'), $4::jsonb, $5, $6, $7, $8)"
                " ON CONFLICT (tenant_id, request_id) DO NOTHING RETURNING id::text AS id",
                {tenant_id, request_id.empty() ? db::Param(std::nullopt) : db::Param(request_id),
                 stored.display_name(), json, stored.priority(),
                 stored.distributed().world_size(), stored.max_restarts().infrastructure(),
                 stored.max_restarts().job()}));
    if (inserted.empty()) {  // a retry: the first call's job, if it asked for the same
      GRADHUB_ASSIGN_OR_RETURN(
          db::Result existing,
          tx.Exec("SELECT id::text AS id, spec = $3::jsonb AS same_spec FROM jobs"
                  " WHERE tenant_id = $1 AND request_id = $2",
                  {tenant_id, request_id, json}));
      if (!existing.row(0).Get<bool>("same_spec")) {
        return absl::AlreadyExistsError(absl::StrCat(
            "request_id '", request_id, "' was used for jobs/",
            existing.row(0).Get<std::string>("id"), " with a different spec"));
      }
      return ReadJob(tx, "jobs/" + existing.row(0).Get<std::string>("id"), tenant_id, false);
    }
    const std::string id = inserted.row(0).Get<std::string>("id");
    GRADHUB_RETURN_IF_ERROR(AppendEvent(tx, id, 0, v1::JobEvent::STATE_CHANGED, std::nullopt,
                                v1::Job::PENDING, Because("submitted")));
    return ReadJob(tx, "jobs/" + id, tenant_id, false);
  });
}

absl::StatusOr<v1::Job> JobManager::GetJob(int64_t tenant_id, const std::string& name) {
  return pool_->Transact(
      [&](db::Transaction& tx) { return ReadJob(tx, name, tenant_id, false); },
      {.read_only = true});
}

absl::StatusOr<v1::ListJobsResponse> JobManager::ListJobs(int64_t tenant_id,
                                                         const v1::ListJobsRequest& request) {
  if (request.page_size() < 0) return absl::InvalidArgumentError("page_size: must not be negative");
  const int32_t page_size =
      request.page_size() == 0 ? kDefaultPageSize : std::min(request.page_size(), kMaxPageSize);
  std::string sql = absl::StrCat("SELECT ", kJobColumns,
                                 " FROM jobs j JOIN tenants t ON t.id = j.tenant_id"
                                 " WHERE j.tenant_id = $1");
  std::vector<db::Param> params = {tenant_id};
  auto bind = [&](db::Param param) {
    params.push_back(std::move(param));
    return absl::StrCat("$", params.size());
  };
  GRADHUB_ASSIGN_OR_RETURN(std::vector<FilterTerm> terms, ParseFilter(request.filter()));
  for (const FilterTerm& term : terms) {
    if (term.field == "state") {
      State state = v1::Job::STATE_UNSPECIFIED;
      if (!v1::Job::State_Parse(term.value, &state) || state == v1::Job::STATE_UNSPECIFIED) {
        return absl::InvalidArgumentError(
            absl::StrCat("filter: state '", term.value, "' is not a job state"));
      }
      absl::StrAppend(&sql, " AND j.state = ", bind(term.value));
    } else if (term.field.rfind("labels.", 0) == 0 && term.field.size() > 7) {
      absl::StrAppend(&sql, " AND j.labels @> jsonb_build_object(", bind(term.field.substr(7)),
                      "::text, ", bind(term.value), "::text)");
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("filter: unknown field '", term.field, "' (state, labels.KEY)"));
    }
  }
  if (!request.page_token().empty()) {
    // "<create time in microseconds>/<job id>" of the last job of the previous page.
    const std::string& token = request.page_token();
    const size_t slash = token.find('/');
    const std::string id = slash == std::string::npos ? "" : JobId("jobs/" + token.substr(slash + 1));
    int64_t micros = 0;
    if (id.empty() || !absl::SimpleAtoi(token.substr(0, slash), &micros)) {
      return absl::InvalidArgumentError("page_token: not a token this server returned");
    }
    absl::StrAppend(&sql, " AND (j.create_time, j.id) < (timestamptz 'epoch' + ", bind(micros),
                    " * interval '1 microsecond', ", bind(id), "::uuid)");
  }
  absl::StrAppend(&sql, " ORDER BY j.create_time DESC, j.id DESC LIMIT ", bind(page_size + 1));
  return pool_->Transact(
      [&](db::Transaction& tx) -> absl::StatusOr<v1::ListJobsResponse> {
        GRADHUB_ASSIGN_OR_RETURN(db::Result rows, tx.Exec(sql, params));
        v1::ListJobsResponse response;
        for (int i = 0; i < rows.rows() && i < page_size; ++i) {
          GRADHUB_ASSIGN_OR_RETURN(*response.add_jobs(), JobFromRow(rows.row(i)));
        }
        if (rows.rows() > page_size) {
          const db::Row last = rows.row(page_size - 1);
          response.set_next_page_token(absl::StrCat(last.Get<int64_t>("create_us"), "/",
                                                    last.Get<std::string>("id")));
        }
        return response;
      },
      {.read_only = true});
}

absl::StatusOr<v1::Job> JobManager::CancelJob(int64_t tenant_id, const std::string& name) {
  return pool_->Transact([&](db::Transaction& tx) -> absl::StatusOr<v1::Job> {
    GRADHUB_ASSIGN_OR_RETURN(v1::Job job, ReadJob(tx, name, tenant_id, true));
    // As jobs.proto says: cancelling a job that already ended returns it unchanged.
    if (job.state() == v1::Job::CANCELLED || job.state() == v1::Job::SUCCEEDED ||
        job.state() == v1::Job::FAILED) {
      return job;
    }
    GRADHUB_RETURN_IF_ERROR(tx.Exec("UPDATE jobs SET cancel_requested = true WHERE id = $1::uuid",
                            {JobId(name)})
                        .status());
    return ApplyTransition(tx, job, v1::Job::CANCELLED, Because("cancelled by the user"));
  });
}

absl::StatusOr<v1::Job> JobManager::Transition(const std::string& name, State to,
                                               const EventDetails& details) {
  return pool_->Transact([&](db::Transaction& tx) -> absl::StatusOr<v1::Job> {
    GRADHUB_ASSIGN_OR_RETURN(v1::Job job, ReadJob(tx, name, -1, true));
    return ApplyTransition(tx, job, to, details);
  });
}

absl::Status JobManager::CheckReady() {
  auto applied = pool_->Exec("SELECT count(*)::bigint AS n FROM schema_migrations");
  if (!applied.ok()) return absl::UnavailableError(applied.status().message());
  if (applied->row(0).Get<int64_t>("n") == 0) {
    return absl::UnavailableError("no migrations applied");
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::ListJobEventsResponse> JobManager::ListJobEvents(int64_t tenant_id,
                                                                   const std::string& name) {
  return pool_->Transact(
      [&](db::Transaction& tx) -> absl::StatusOr<v1::ListJobEventsResponse> {
        GRADHUB_ASSIGN_OR_RETURN(v1::Job job, ReadJob(tx, name, tenant_id, false));
        GRADHUB_ASSIGN_OR_RETURN(
            db::Result rows,
            tx.Exec("SELECT id, attempt, type, coalesce(from_state, '') AS from_state, to_state,"
                    " message, coalesce(failure_kind, 'NONE') AS failure_kind,"
                    " coalesce(rank, -1) AS rank, coalesce(node, '') AS node,"
                    " coalesce(exit_code, 0) AS exit_code, coalesce(signal, 0) AS signal,"
                    " (extract(epoch FROM create_time) * 1e6)::bigint AS time_us"
                    " FROM job_events WHERE job_id = $1::uuid ORDER BY id",
                    {JobId(name)}));
        v1::ListJobEventsResponse events;
        for (const db::Row& row : rows) {
          v1::JobEvent& event = *events.add_events();
          event.set_id(row.Get<int64_t>("id"));
          event.set_job(job.name());
          event.set_attempt(row.Get<int32_t>("attempt"));
          *event.mutable_time() = Micros(row, "time_us");
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
        }
        return events;
      },
      {.read_only = true});
}

}  // namespace gradhub::api
