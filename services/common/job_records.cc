#include "services/common/job_records.h"

#include <google/protobuf/util/json_util.h>
#include <google/protobuf/util/time_util.h>

#include <algorithm>
#include <regex>

#include "absl/strings/str_cat.h"
#include "services/common/status_macros.h"

namespace gradhub::api {

using State = v1::Job::State;
using google::protobuf::util::TimeUtil;

// Columns every job read selects, timestamps as microseconds since the epoch.
// One list for both, so a create's row and every other read of a job never drift apart.
#define GRADHUB_JOB_STATE_COLUMNS                                                   \
  "j.id::text AS id, t.name AS tenant, j.state, j.state_reason, j.current_attempt," \
  " j.infra_restarts, j.job_restarts, j.progress_step, j.progress_total_steps,"     \
  " j.progress_loss, j.progress_samples_per_second, j.progress_epoch,"              \
  " j.progress_learning_rate, j.progress_eval_metrics::text AS progress_eval,"      \
  " (extract(epoch FROM j.progress_time) * 1e6)::bigint AS progress_us, j.version," \
  " coalesce(j.request_id, '') AS request_id,"                                      \
  " (extract(epoch FROM j.create_time) * 1e6)::bigint AS create_us,"                \
  " (extract(epoch FROM j.update_time) * 1e6)::bigint AS update_us,"                \
  " (extract(epoch FROM j.start_time) * 1e6)::bigint AS start_us,"                  \
  " (extract(epoch FROM j.end_time) * 1e6)::bigint AS end_us"
extern const char kJobStateColumns[] = GRADHUB_JOB_STATE_COLUMNS;
extern const char kJobColumns[] = GRADHUB_JOB_STATE_COLUMNS ", j.spec::text AS spec";
#undef GRADHUB_JOB_STATE_COLUMNS

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

absl::Status JobNotFound(const std::string& name) {
  return absl::NotFoundError(absl::StrCat("job '", name, "' not found"));
}

google::protobuf::Timestamp MicrosColumn(const db::Row& row, const char* column) {
  return TimeUtil::MicrosecondsToTimestamp(row.Get<int64_t>(column));
}

namespace {

// The jobs.progress_* columns (NULL: not reported yet) as Job.progress.
absl::Status ReadProgress(const db::Row& row, v1::JobProgress* progress) {
  progress->set_step(row.Get<int64_t>("progress_step"));
  progress->set_total_steps(row.Get<int64_t>("progress_total_steps"));
  if (!row.IsNull("progress_epoch")) {
    progress->set_epoch(static_cast<int32_t>(row.Get<int64_t>("progress_epoch")));
  }
  if (!row.IsNull("progress_loss")) progress->set_loss(row.Get<double>("progress_loss"));
  if (!row.IsNull("progress_samples_per_second")) {
    progress->set_samples_per_second(row.Get<double>("progress_samples_per_second"));
  }
  if (!row.IsNull("progress_learning_rate")) {
    progress->set_learning_rate(row.Get<double>("progress_learning_rate"));
  }
  if (!row.IsNull("progress_us")) {
    *progress->mutable_last_report_time() = MicrosColumn(row, "progress_us");
  }
  if (row.IsNull("progress_eval")) return absl::OkStatus();
  // A JSON object of finite numbers (job_metrics.h RecordJobProgress), which is what the
  // proto3 JSON mapping of a map<string, double> reads. Parsed into a message of its own:
  // parsing replaces every field of the message it fills.
  v1::JobProgress eval;
  const auto parsed = google::protobuf::util::JsonStringToMessage(
      absl::StrCat(R"({"evalMetrics":)", row.Get<std::string>("progress_eval"), "}"), &eval);
  if (!parsed.ok()) {
    return absl::InternalError(absl::StrCat("stored eval metrics: ", parsed.ToString()));
  }
  *progress->mutable_eval_metrics() = eval.eval_metrics();
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<v1::Job> JobFromRow(const db::Row& row, bool with_spec) {
  v1::Job job;
  job.set_name("jobs/" + row.Get<std::string>("id"));
  job.set_tenant("tenants/" + row.Get<std::string>("tenant"));
  if (with_spec) {
    const auto parsed = google::protobuf::util::JsonStringToMessage(row.Get<std::string>("spec"),
                                                                    job.mutable_spec());
    if (!parsed.ok()) return absl::InternalError(absl::StrCat("stored spec: ", parsed.ToString()));
  }
  State state = v1::Job::STATE_UNSPECIFIED;
  v1::Job::State_Parse(row.Get<std::string>("state"), &state);
  job.set_state(state);
  job.set_state_reason(row.Get<std::string>("state_reason"));
  job.set_attempt(row.Get<int32_t>("current_attempt"));
  job.set_infrastructure_restarts(row.Get<int32_t>("infra_restarts"));
  job.set_job_restarts(row.Get<int32_t>("job_restarts"));
  if (absl::Status read = ReadProgress(row, job.mutable_progress()); !read.ok()) return read;
  job.set_request_id(row.Get<std::string>("request_id"));
  job.set_etag(std::to_string(row.Get<int64_t>("version")));
  *job.mutable_create_time() = MicrosColumn(row, "create_us");
  *job.mutable_update_time() = MicrosColumn(row, "update_us");
  if (!row.IsNull("start_us")) *job.mutable_start_time() = MicrosColumn(row, "start_us");
  if (!row.IsNull("end_us")) *job.mutable_end_time() = MicrosColumn(row, "end_us");
  return job;
}

absl::StatusOr<v1::Job> ReadJob(db::Transaction& tx, const std::string& name, int64_t tenant_id,
                                bool for_update) {
  const std::string id = JobId(name);
  if (id.empty()) return JobNotFound(name);
  GRADHUB_ASSIGN_OR_RETURN(db::Result result,
                           tx.Exec(absl::StrCat("SELECT ", kJobColumns,
                                                " FROM jobs j JOIN tenants t ON t.id = j.tenant_id"
                                                " WHERE j.id = $1::uuid AND ($2::bigint < 0 OR"
                                                " j.tenant_id = $2::bigint)",
                                                for_update ? " FOR UPDATE OF j" : ""),
                                   {id, tenant_id}));
  if (result.empty()) return JobNotFound(name);
  return JobFromRow(result.row(0));
}

absl::Status AppendEvent(db::Transaction& tx, const std::string& job_id, int32_t attempt,
                         v1::JobEvent::Type type, std::optional<State> from,
                         std::optional<State> to, const EventDetails& details) {
  const auto failure = details.failure_kind == v1::JobEvent::NONE
                           ? std::optional<std::string>()
                           : v1::JobEvent::FailureKind_Name(details.failure_kind);
  return tx
      .Exec(
          "INSERT INTO job_events (job_id, attempt, type, from_state, to_state, message,"
          " failure_kind, rank, node, exit_code, signal, checkpoint_step,"
          " checkpoint_size_bytes)"
          " VALUES ($1::uuid, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)",
          {job_id, attempt, v1::JobEvent::Type_Name(type),
           from ? db::Param(v1::Job::State_Name(*from)) : db::Param(std::nullopt),
           to ? db::Param(v1::Job::State_Name(*to)) : db::Param(std::nullopt), details.message,
           failure ? db::Param(*failure) : db::Param(std::nullopt),
           details.rank >= 0 ? db::Param(details.rank) : db::Param(std::nullopt),
           details.node.empty() ? db::Param(std::nullopt) : db::Param(details.node),
           details.exit_code != 0 ? db::Param(details.exit_code) : db::Param(std::nullopt),
           details.signal != 0 ? db::Param(details.signal) : db::Param(std::nullopt),
           details.checkpoint_step >= 0 ? db::Param(details.checkpoint_step)
                                        : db::Param(std::nullopt),
           details.checkpoint_size_bytes >= 0 ? db::Param(details.checkpoint_size_bytes)
                                              : db::Param(std::nullopt)})
      .status();
}

absl::StatusOr<v1::Job> ApplyTransition(db::Transaction& tx, const v1::Job& job, State to,
                                        const EventDetails& details) {
  if (!IsAllowedTransition(job.state(), to)) {
    return absl::FailedPreconditionError(
        absl::StrCat(job.name(), " is ", v1::Job::State_Name(job.state()), "; it cannot become ",
                     v1::Job::State_Name(to)));
  }
  const std::string id = JobId(job.name());
  GRADHUB_RETURN_IF_ERROR(
      tx.Exec("UPDATE jobs SET state = $2, state_reason = $3, version = version + 1,"
              " update_time = now(),"
              " start_time = CASE WHEN $2 = 'RUNNING' THEN coalesce(start_time, now())"
              "   ELSE start_time END,"
              " end_time = CASE WHEN $2 IN ('SUCCEEDED', 'FAILED', 'CANCELLED')"
              "   THEN now() ELSE NULL END"
              " WHERE id = $1::uuid",
              {id, v1::Job::State_Name(to), details.message})
          .status());
  GRADHUB_RETURN_IF_ERROR(
      AppendEvent(tx, id, job.attempt(), v1::JobEvent::STATE_CHANGED, job.state(), to, details));
  return ReadJob(tx, job.name(), -1, false);
}

absl::StatusOr<std::vector<FilterTerm>> ParseListFilter(const std::string& filter) {
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

std::optional<std::string> LabelCondition(const FilterTerm& term, const std::string& column,
                                          db::ParamList& params) {
  constexpr std::string_view kPrefix = "labels.";
  if (term.field.rfind(kPrefix, 0) != 0 || term.field.size() == kPrefix.size()) {
    return std::nullopt;
  }
  return absl::StrCat(column, " @> jsonb_build_object(",
                      params.Bind(term.field.substr(kPrefix.size())), "::text, ",
                      params.Bind(term.value), "::text)");
}

absl::StatusOr<int32_t> ListPageSize(int32_t requested) {
  constexpr int32_t kDefaultPageSize = 50;
  constexpr int32_t kMaxPageSize = 1000;
  if (requested < 0) return absl::InvalidArgumentError("page_size: must not be negative");
  return requested == 0 ? kDefaultPageSize : std::min(requested, kMaxPageSize);
}

State StateAfterCancel(State state, int64_t live_ranks) {
  if (IsTerminal(state) || state == v1::Job::CANCELLING) return state;
  return live_ranks > 0 ? v1::Job::CANCELLING : v1::Job::CANCELLED;
}

bool IsAllowedTransition(State from, State to) {
  switch (from) {
    case v1::Job::PENDING:
      return to == v1::Job::SCHEDULED || to == v1::Job::FAILED || to == v1::Job::CANCELLED;
    case v1::Job::SCHEDULED:
      return to == v1::Job::RUNNING || to == v1::Job::RESTARTING || to == v1::Job::FAILED ||
             to == v1::Job::CANCELLED || to == v1::Job::CANCELLING;
    case v1::Job::RUNNING:
      return to == v1::Job::SUCCEEDED || to == v1::Job::FAILED || to == v1::Job::CANCELLED ||
             to == v1::Job::RESTARTING || to == v1::Job::CANCELLING;
    case v1::Job::RESTARTING:
      return to == v1::Job::SCHEDULED || to == v1::Job::FAILED || to == v1::Job::CANCELLED ||
             to == v1::Job::CANCELLING;
    case v1::Job::CANCELLING:
      return to == v1::Job::CANCELLED;
    default:
      return false;
  }
}

}  // namespace gradhub::api
