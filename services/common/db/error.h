// How PostgreSQL failures become absl::Status. Three parts, for three readers:
//   - the code says what a caller can do about it (ALREADY_EXISTS, ABORTED: run it again,
//     UNAVAILABLE, ...; INTERNAL for every condition no caller expects);
//   - the message is what a client may read: a fixed sentence per condition, never SQL,
//     parameters or the driver's text (those name tables, constraints, hosts and the values of
//     other rows). Handlers pass messages on unchanged, so this is where that is decided;
//   - the details (PostgreSQL's message, detail and constraint, and the statement's start)
//     travel as a payload (DetailsOf) that no transport sends, and are written to the
//     server's log (stderr) for the conditions no caller expects.
// The SQLSTATE travels as a payload too, so callers branch on the exact condition (SqlStateOf)
// without parsing messages. Thread-safe.
#pragma once

#include <libpq-fe.h>

#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace gradhub::db {

namespace sqlstate {
inline constexpr std::string_view kUniqueViolation = "23505";
inline constexpr std::string_view kForeignKeyViolation = "23503";
inline constexpr std::string_view kCheckViolation = "23514";
inline constexpr std::string_view kNotNullViolation = "23502";
inline constexpr std::string_view kSerializationFailure = "40001";
inline constexpr std::string_view kDeadlockDetected = "40P01";
inline constexpr std::string_view kQueryCanceled = "57014";
// Raised by our own trigger (migrations/0001) for a job state change that the lifecycle
// does not allow.
inline constexpr std::string_view kIllegalTransition = "GH001";
// Reported by us (not the server) when the connection broke: class 08 "connection exception".
inline constexpr std::string_view kConnectionFailure = "08006";
}  // namespace sqlstate

// The SQLSTATE a database status carries, or "" for statuses that did not come from here.
std::string SqlStateOf(const absl::Status& status);

// What the database said, for the server's own log and tests: "" for statuses that did not
// come from here. Never sent to a client: PostgreSQL's message may quote a value it could not
// read. Parameters are not added, nor the detail of class 23 (it quotes rows and keys).
std::string DetailsOf(const absl::Status& status);

// Worth running the whole transaction again: serialization failure or deadlock.
bool IsRetryableConflict(const absl::Status& status);

// The connection is gone (server restart, network): reconnecting may help.
bool IsConnectionLost(const absl::Status& status);

// The database stayed silent: a connect or an answer did not come within its timeout (the
// kernel gave up on an open connection whose data or keepalives went unanswered, or a connect
// timed out), or the pool already knows it to be unreachable (pool.h). Also IsConnectionLost.
// Trying again at once would only wait as long again.
bool IsSilence(const absl::Status& status);

// UNAVAILABLE for silence (IsSilence), with `client_message` for the client (no host, no
// driver text) and `details` (DetailsOf). Not logged here: the pool logs an outage once, when it
// begins, rather than once per call that meets it.
absl::Status SilenceStatus(std::string_view client_message, const std::string& details);

// DEADLINE_EXCEEDED for a statement or connect given up by its caller's deadline (a health
// check's budget): the database may be slow rather than gone, so it is not silence.
absl::Status CallerDeadlineStatus(std::string_view context);

// Status for a failed result. `statement` goes into the details, shortened, to say which
// query failed.
absl::Status StatusFromResult(const PGresult* result, const PGconn* conn,
                              std::string_view statement);

// Status for a failure with no usable result (connection broken, out of memory).
absl::Status StatusFromConnection(const PGconn* conn, std::string_view context);

// INVALID_ARGUMENT for a text parameter holding a NUL character, refused before it is sent:
// libpq would cut it there (a request id "a\0b" would match "a"). Request handlers refuse NUL
// naming the field (text_rules.h); this is the last line for a field one of them missed.
absl::Status NulParameterStatus(std::string_view statement);

}  // namespace gradhub::db
