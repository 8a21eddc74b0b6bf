// How PostgreSQL failures become absl::Status: the code says what a caller can do about it,
// the message says what happened, and the SQLSTATE travels along as a payload so callers can
// branch on the exact condition (SqlStateOf) without parsing messages.
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

// Worth running the whole transaction again: serialization failure or deadlock.
bool IsRetryableConflict(const absl::Status& status);

// The connection is gone (server restart, network): reconnecting may help.
bool IsConnectionLost(const absl::Status& status);

// Status for a failed result. `statement` is shown shortened, to say which query failed;
// parameters are never included in messages (they may hold user data or secrets).
absl::Status StatusFromResult(const PGresult* result, const PGconn* conn,
                              std::string_view statement);

// Status for a failure with no usable result (connection broken, out of memory).
absl::Status StatusFromConnection(const PGconn* conn, std::string_view context);

}  // namespace gradhub::db
