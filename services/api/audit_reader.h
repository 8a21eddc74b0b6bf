// AuditService.ListAuditEvents as rules over an AuditLog (services/common/audit/audit_log.h):
// who may read which events, the filter's grammar, page sizes and page tokens. The gRPC
// adapter (audit_service.h) and the REST gateway (GET /v1/auditEvents) both call it.
//
// Who reads what:
//   - the admin token reads every event;
//   - a tenant token reads its own tenant's events only: its filter's tenant is forced to its
//     tenant, and a filter naming another tenant is PERMISSION_DENIED (rather than an empty
//     page, so that a script asking for the wrong tenant learns why it sees nothing);
//   - node and job tokens are PERMISSION_DENIED; a refused token UNAUTHENTICATED.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "gradhub/v1/audit.pb.h"
#include "services/common/audit/audit_log.h"
#include "services/common/auth/authenticator.h"

namespace gradhub::api {

// The events a caller may read: all of them, or those of one tenant.
struct AuditScope {
  std::string tenant;  // tenants/{t}; "" = every tenant (the admin token)
};

// audit.proto's grammar: `key=value` terms separated by spaces, each key at most once, keys
// tenant, actor, method, resource and outcome; tenant is tenants/{t}, outcome OK or a gRPC code
// name. INVALID_ARGUMENT naming the key (or the term) at fault.
absl::StatusOr<audit::AuditFilter> ParseAuditFilter(const std::string& filter);

// 1 to 1000; 0 = 100. INVALID_ARGUMENT naming page_size otherwise.
absl::StatusOr<int32_t> AuditPageSize(int32_t requested);

// An opaque page token (page_token.h): the last event's id and a digest of the filter it was
// listed with, so that a token is refused with another filter (or another tenant's scope)
// rather than continuing a listing it did not start.
std::string AuditPageToken(int64_t last_id, const audit::AuditFilter& filter);
// The id a token continues before; INVALID_ARGUMENT naming page_token for one this server did
// not make for `filter`.
absl::StatusOr<int64_t> AuditPageTokenBefore(const std::string& token,
                                             const audit::AuditFilter& filter);

// Thread-safe as Authenticator and AuditLog are: it keeps no state of its own.
class AuditReader {
 public:
  // Not owned; both must outlive the reader.
  AuditReader(const Authenticator* auth, audit::AuditLog* log) : auth_(auth), log_(log) {}

  // The scope of the caller's `authorization` header (see the top).
  absl::StatusOr<AuditScope> Authorize(const std::string& authorization) const;

  // One page, newest first, within `scope`.
  absl::StatusOr<v1::ListAuditEventsResponse> List(const AuditScope& scope,
                                                   const v1::ListAuditEventsRequest& request) const;

 private:
  const Authenticator* auth_;
  audit::AuditLog* log_;
};

}  // namespace gradhub::api
