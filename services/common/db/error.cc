#include "services/common/db/error.h"

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace gradhub::db {
namespace {

// absl::string_view: Debian builds Abseil with its own string_view, not std::string_view.
constexpr absl::string_view kSqlStatePayload = "type.gradhub.dev/sqlstate";
constexpr size_t kStatementPreview = 80;

absl::StatusCode CodeFor(std::string_view state) {
  if (state == sqlstate::kUniqueViolation) return absl::StatusCode::kAlreadyExists;
  if (state == sqlstate::kForeignKeyViolation) return absl::StatusCode::kFailedPrecondition;
  if (state == sqlstate::kIllegalTransition) return absl::StatusCode::kFailedPrecondition;
  if (state == sqlstate::kSerializationFailure || state == sqlstate::kDeadlockDetected) {
    return absl::StatusCode::kAborted;
  }
  if (state == sqlstate::kQueryCanceled) return absl::StatusCode::kDeadlineExceeded;
  std::string_view cls = state.substr(0, 2);
  if (cls == "22" || cls == "23") return absl::StatusCode::kInvalidArgument;  // bad data
  if (cls == "08" || state == "57P01" || state == "57P02" || state == "57P03") {
    return absl::StatusCode::kUnavailable;  // connection lost, server shutting down
  }
  if (cls == "53") return absl::StatusCode::kResourceExhausted;
  return absl::StatusCode::kInternal;  // e.g. class 42: our own SQL is wrong
}

std::string Preview(std::string_view statement) {
  std::string flat(statement.substr(0, kStatementPreview));
  for (char& c : flat) {
    if (c == '\n' || c == '\t') c = ' ';
  }
  if (statement.size() > kStatementPreview) flat += "...";
  return flat;
}

absl::Status WithState(absl::StatusCode code, std::string message, std::string_view state) {
  absl::Status status(code, message);
  status.SetPayload(kSqlStatePayload, absl::Cord(std::string(state)));
  return status;
}

std::string Trimmed(const char* text) {
  return std::string(absl::StripTrailingAsciiWhitespace(text == nullptr ? "" : text));
}

}  // namespace

std::string SqlStateOf(const absl::Status& status) {
  auto payload = status.GetPayload(kSqlStatePayload);
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

absl::Status StatusFromConnection(const PGconn* conn, std::string_view context) {
  std::string reason = conn ? Trimmed(PQerrorMessage(conn)) : "out of memory";
  return WithState(absl::StatusCode::kUnavailable,
                   absl::StrCat(std::string(context), ": postgres connection failed: ", reason),
                   sqlstate::kConnectionFailure);
}

absl::Status StatusFromResult(const PGresult* result, const PGconn* conn,
                              std::string_view statement) {
  // A broken connection yields either no result or a result without a SQLSTATE.
  const char* state = result ? PQresultErrorField(result, PG_DIAG_SQLSTATE) : nullptr;
  if (state == nullptr || (conn != nullptr && PQstatus(conn) == CONNECTION_BAD)) {
    return StatusFromConnection(conn, Preview(statement));
  }
  std::string message = absl::StrCat(Trimmed(PQresultErrorField(result, PG_DIAG_MESSAGE_PRIMARY)),
                                     " [SQLSTATE ", state, "]");
  if (const char* detail = PQresultErrorField(result, PG_DIAG_MESSAGE_DETAIL)) {
    absl::StrAppend(&message, " (", Trimmed(detail), ")");
  }
  if (const char* constraint = PQresultErrorField(result, PG_DIAG_CONSTRAINT_NAME)) {
    absl::StrAppend(&message, " constraint ", constraint);
  }
  absl::StrAppend(&message, " in: ", Preview(statement));
  return WithState(CodeFor(state), std::move(message), state);
}

}  // namespace gradhub::db
