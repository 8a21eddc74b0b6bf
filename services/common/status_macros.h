// Early-return helpers for absl::Status / absl::StatusOr<T>, the error model of every service.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define GRADHUB_STATUS_CONCAT_INNER_(a, b) a##b
#define GRADHUB_STATUS_CONCAT_(a, b) GRADHUB_STATUS_CONCAT_INNER_(a, b)

// Returns from the enclosing function when `expr` (an absl::Status) is not OK.
#define GRADHUB_RETURN_IF_ERROR(expr)                  \
  do {                                                 \
    ::absl::Status gradhub_status_ = (expr);           \
    if (!gradhub_status_.ok()) return gradhub_status_; \
  } while (0)

// `GRADHUB_ASSIGN_OR_RETURN(auto x, Fn());` declares x from an OK StatusOr or returns its error.
#define GRADHUB_ASSIGN_OR_RETURN(lhs, expr) \
  GRADHUB_ASSIGN_OR_RETURN_IMPL_(GRADHUB_STATUS_CONCAT_(gradhub_statusor_, __LINE__), lhs, expr)
#define GRADHUB_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                                   \
  if (!statusor.ok()) return std::move(statusor).status();  \
  lhs = std::move(statusor).value()
