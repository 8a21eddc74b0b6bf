#include "services/common/db/error.h"

#include <chrono>
#include <iostream>
#include <mutex>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace gradhub::db {
namespace {

// absl::string_view: Debian builds Abseil with its own string_view, not std::string_view.
constexpr absl::string_view kSqlStatePayload = "type.gradhub.dev/sqlstate";
constexpr absl::string_view kDetailsPayload = "type.gradhub.dev/db-details";
constexpr absl::string_view kSilencePayload = "type.gradhub.dev/db-silence";
constexpr size_t kStatementPreview = 80;

// What a condition means to a caller and a client; `message` null = PostgreSQL's own primary
// message, which only our own trigger raises (migrations/0001: "job X cannot go from A to B").
struct Condition {
  absl::StatusCode code;
  const char* message;
  bool log;  // no caller expects it: the details go to the server's log
};

Condition ConditionFor(std::string_view state) {
  using absl::StatusCode;
  if (state == sqlstate::kUniqueViolation) {
    return {StatusCode::kAlreadyExists, "conflicts with an existing record", false};
  }
  if (state == sqlstate::kForeignKeyViolation) {
    return {StatusCode::kFailedPrecondition,
            "refers to a record that does not exist, or is referred to by one", false};
  }
  if (state == sqlstate::kIllegalTransition)
    return {StatusCode::kFailedPrecondition, nullptr, false};
  if (state == sqlstate::kSerializationFailure || state == sqlstate::kDeadlockDetected) {
    return {StatusCode::kAborted, "conflicted with a concurrent change; try again", false};
  }
  if (state == sqlstate::kQueryCanceled) {
    return {StatusCode::kDeadlineExceeded, "the database took too long to answer", true};
  }
  const std::string_view cls = state.substr(0, 2);
  if (cls == "08" || state == "57P01" || state == "57P02" || state == "57P03") {
    return {StatusCode::kUnavailable, "the database is unavailable", true};
  }
  if (cls == "53")
    return {StatusCode::kResourceExhausted, "the database is out of resources", true};
  // Class 22 (bad data) and 23 (a rule of the schema) included: request handlers refuse bad
  // input naming its field, so reaching the database with it is a bug of ours.
  return {StatusCode::kInternal, "internal database error; the server's log has the details", true};
}

std::string Preview(std::string_view statement) {
  std::string flat(statement.substr(0, kStatementPreview));
  for (char& c : flat) {
    if (c == '\n' || c == '\t') c = ' ';
  }
  if (statement.size() > kStatementPreview) flat += "...";
  return flat;
}

std::string Trimmed(const char* text) {
  return std::string(absl::StripTrailingAsciiWhitespace(text == nullptr ? "" : text));
}

// One line on stderr per failure, at most kLinesPerSecond a second: a database that is down
// fails every request, and the log must stay readable. Lines dropped are counted in the next.
void LogLine(const std::string& line) {
  constexpr int kLinesPerSecond = 10;
  static std::mutex mu;
  static std::chrono::steady_clock::time_point window_start;
  static int lines = 0;
  static int64_t dropped = 0;
  std::lock_guard<std::mutex> lock(mu);
  const auto now = std::chrono::steady_clock::now();
  if (now - window_start >= std::chrono::seconds(1)) {
    window_start = now;
    lines = 0;
  }
  if (++lines > kLinesPerSecond) {
    ++dropped;
    return;
  }
  std::cerr << "gradhub db: " << line;
  if (dropped > 0) std::cerr << " (" << dropped << " earlier lines dropped)";
  std::cerr << "\n";
  dropped = 0;
}

absl::Status Make(std::string_view state, const std::string& details, const char* own_message) {
  const Condition condition = ConditionFor(state);
  if (condition.log) LogLine(absl::StrCat("SQLSTATE ", std::string(state), ": ", details));
  const std::string message =
      condition.message != nullptr
          ? absl::StrCat(condition.message, " (SQLSTATE ", std::string(state), ")")
          : own_message;
  absl::Status status(condition.code, message);
  status.SetPayload(kSqlStatePayload, absl::Cord(std::string(state)));
  status.SetPayload(kDetailsPayload, absl::Cord(details));
  return status;
}

}  // namespace

std::string SqlStateOf(const absl::Status& status) {
  auto payload = status.GetPayload(kSqlStatePayload);
  return payload ? std::string(*payload) : std::string();
}

std::string DetailsOf(const absl::Status& status) {
  auto payload = status.GetPayload(kDetailsPayload);
  return payload ? std::string(*payload) : std::string();
}

bool IsRetryableConflict(const absl::Status& status) {
  std::string state = SqlStateOf(status);
  return state == sqlstate::kSerializationFailure || state == sqlstate::kDeadlockDetected;
}

bool IsConnectionLost(const absl::Status& status) {
  std::string state = SqlStateOf(status);
  return state.rfind("08", 0) == 0 || state == "57P01" || state == "57P02" || state == "57P03";
}

bool IsSilence(const absl::Status& status) {
  return status.GetPayload(kSilencePayload).has_value();
}

absl::Status SilenceStatus(std::string_view client_message, const std::string& details) {
  absl::Status status(absl::StatusCode::kUnavailable,
                      absl::StrCat(std::string(client_message), " (SQLSTATE ",
                                   std::string(sqlstate::kConnectionFailure), ")"));
  status.SetPayload(kSqlStatePayload, absl::Cord(std::string(sqlstate::kConnectionFailure)));
  status.SetPayload(kDetailsPayload, absl::Cord(details));
  status.SetPayload(kSilencePayload, absl::Cord("1"));
  return status;
}

absl::Status CallerDeadlineStatus(std::string_view context) {
  absl::Status status(absl::StatusCode::kDeadlineExceeded,
                      "the database did not answer within the call's deadline");
  status.SetPayload(kDetailsPayload, absl::Cord(absl::StrCat("given up at the caller's deadline: ",
                                                             std::string(context))));
  return status;
}

absl::Status StatusFromConnection(const PGconn* conn, std::string_view context) {
  const std::string reason = conn ? Trimmed(PQerrorMessage(conn)) : "out of memory";
  return Make(sqlstate::kConnectionFailure,
              absl::StrCat(std::string(context), ": postgres connection failed: ", reason), "");
}

absl::Status StatusFromResult(const PGresult* result, const PGconn* conn,
                              std::string_view statement) {
  // A broken connection yields either no result or a result without a SQLSTATE.
  const char* state = result ? PQresultErrorField(result, PG_DIAG_SQLSTATE) : nullptr;
  if (state == nullptr || (conn != nullptr && PQstatus(conn) == CONNECTION_BAD)) {
    return StatusFromConnection(conn, Preview(statement));
  }
  const std::string primary = Trimmed(PQresultErrorField(result, PG_DIAG_MESSAGE_PRIMARY));
  std::string details = primary;
  // Not for class 23: its detail quotes the row or key values ("Key (name)=(x)"), which may
  // be a client's data.
  const char* detail = std::string_view(state).substr(0, 2) == "23"
                           ? nullptr
                           : PQresultErrorField(result, PG_DIAG_MESSAGE_DETAIL);
  if (detail != nullptr) {
    absl::StrAppend(&details, " (", Trimmed(detail), ")");
  }
  if (const char* constraint = PQresultErrorField(result, PG_DIAG_CONSTRAINT_NAME)) {
    absl::StrAppend(&details, " constraint ", constraint);
  }
  absl::StrAppend(&details, " in: ", Preview(statement));
  return Make(state, details, primary.c_str());
}

absl::Status NulParameterStatus(std::string_view statement) {
  const std::string details =
      absl::StrCat("a text parameter holds a NUL character, refused in: ", Preview(statement));
  LogLine(details);
  absl::Status status = absl::InvalidArgumentError(
      "a text value holds a NUL character, which the database cannot store");
  status.SetPayload(kDetailsPayload, absl::Cord(details));
  return status;
}

}  // namespace gradhub::db
