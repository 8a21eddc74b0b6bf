#include "services/api/audit_reader.h"

#include <limits>
#include <regex>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "services/common/audit/audited_calls.h"
#include "services/common/page_token.h"
#include "services/common/sha256.h"
#include "services/common/status_macros.h"

namespace gradhub::api {
namespace {

constexpr int32_t kDefaultPageSize = 100;
constexpr int32_t kMaxPageSize = 1000;
// Hex characters of the filter's SHA-256 a page token carries.
constexpr size_t kFilterDigestChars = 16;
// The list a page token names (page_token.h).
constexpr char kPageTokenList[] = "auditEvents";

// The filter's field for `key`, nullptr for a key the grammar does not have.
std::optional<std::string>* FieldOf(audit::AuditFilter& filter, absl::string_view key) {
  if (key == "tenant") return &filter.tenant;
  if (key == "actor") return &filter.actor;
  if (key == "method") return &filter.method;
  if (key == "resource") return &filter.resource;
  if (key == "outcome") return &filter.outcome;
  return nullptr;
}

// What a term's value may be beyond being one: text PostgreSQL stores (an event could not hold
// anything else), within the bounds events have, and for tenant and outcome their form.
absl::Status CheckValue(absl::string_view key, const std::string& value) {
  if (audit::BoundedText(value, audit::kMaxNameChars) != value) {
    return absl::InvalidArgumentError(absl::StrCat("filter: the value of ", key,
                                                   " must be valid UTF-8 without NUL, at most ",
                                                   audit::kMaxNameChars, " characters"));
  }
  static const std::regex kTenant("tenants/[a-z][a-z0-9-]{0,62}");
  if (key == "tenant" && !std::regex_match(value, kTenant)) {
    return absl::InvalidArgumentError(
        absl::StrCat("filter: tenant '", value, "' is not tenants/{tenant_id}"));
  }
  if (key == "outcome" && !audit::OutcomeCode(value)) {
    return absl::InvalidArgumentError(
        absl::StrCat("filter: outcome '", value,
                     "' is not OK or a gRPC status code name (NOT_FOUND, PERMISSION_DENIED, ...)"));
  }
  return absl::OkStatus();
}

std::string FilterDigest(const audit::AuditFilter& filter) {
  std::string canonical;
  for (const std::optional<std::string>* field :
       {&filter.tenant, &filter.actor, &filter.method, &filter.resource, &filter.outcome}) {
    // Unit separators between fields; an unset field differs from an empty one.
    absl::StrAppend(&canonical, *field ? "=" + **field : "-", "\x1f");
  }
  return Sha256Hex(canonical).substr(0, kFilterDigestChars);
}

}  // namespace

absl::StatusOr<audit::AuditFilter> ParseAuditFilter(const std::string& filter) {
  audit::AuditFilter parsed;
  for (absl::string_view term : absl::StrSplit(filter, ' ', absl::SkipEmpty())) {
    const size_t eq = term.find('=');
    if (eq == absl::string_view::npos || eq == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("filter: '", audit::BoundedText(term, 64), "' is not key=value"));
    }
    const absl::string_view key = term.substr(0, eq);
    std::optional<std::string>* field = FieldOf(parsed, key);
    if (field == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("filter: unknown key '", audit::BoundedText(key, 64),
                       "' (tenant, actor, method, resource, outcome)"));
    }
    if (field->has_value()) {
      return absl::InvalidArgumentError(absl::StrCat("filter: ", key, " given twice"));
    }
    const std::string value(term.substr(eq + 1));
    GRADHUB_RETURN_IF_ERROR(CheckValue(key, value));
    *field = value;
  }
  return parsed;
}

absl::StatusOr<int32_t> AuditPageSize(int32_t requested) {
  if (requested < 0 || requested > kMaxPageSize) {
    return absl::InvalidArgumentError(absl::StrCat("page_size: ", requested,
                                                   " is not between 1 and ", kMaxPageSize,
                                                   " (0 = ", kDefaultPageSize, ")"));
  }
  return requested == 0 ? kDefaultPageSize : requested;
}

std::string AuditPageToken(int64_t last_id, const audit::AuditFilter& filter) {
  const std::string id = absl::StrCat(last_id);
  return MakePageToken(kPageTokenList, {id, FilterDigest(filter)});
}

absl::StatusOr<int64_t> AuditPageTokenBefore(const std::string& token,
                                             const audit::AuditFilter& filter) {
  GRADHUB_ASSIGN_OR_RETURN(const std::vector<std::string> parts,
                           ReadPageToken(token, kPageTokenList, 2));
  GRADHUB_ASSIGN_OR_RETURN(const int64_t id,
                           PageTokenInt(parts[0], 1, std::numeric_limits<int64_t>::max()));
  if (parts[1] != FilterDigest(filter)) {
    return absl::InvalidArgumentError(
        "page_token: returned for another filter; list again without it");
  }
  return id;
}

absl::StatusOr<AuditScope> AuditReader::Authorize(const std::string& authorization) const {
  GRADHUB_ASSIGN_OR_RETURN(const Principal caller, auth_->Authenticate(authorization));
  if (caller.kind == Principal::Kind::kAdmin) return AuditScope{};
  if (caller.kind == Principal::Kind::kTenant) return AuditScope{"tenants/" + caller.tenant_name};
  return absl::PermissionDeniedError(
      "audit events are read with the admin token or a tenant token");
}

absl::StatusOr<v1::ListAuditEventsResponse> AuditReader::List(
    const AuditScope& scope, const v1::ListAuditEventsRequest& request) const {
  GRADHUB_ASSIGN_OR_RETURN(audit::AuditFilter filter, ParseAuditFilter(request.filter()));
  if (!scope.tenant.empty()) {
    if (filter.tenant && *filter.tenant != scope.tenant) {
      return absl::PermissionDeniedError(absl::StrCat("filter: tenant=", *filter.tenant,
                                                      ": this token reads only ", scope.tenant,
                                                      "'s events"));
    }
    filter.tenant = scope.tenant;
  }
  GRADHUB_ASSIGN_OR_RETURN(const int32_t page_size, AuditPageSize(request.page_size()));
  // One more than a page tells whether another page follows.
  audit::AuditQuery query{.filter = filter, .before_id = 0, .limit = page_size + 1};
  if (!request.page_token().empty()) {
    GRADHUB_ASSIGN_OR_RETURN(query.before_id, AuditPageTokenBefore(request.page_token(), filter));
  }
  GRADHUB_ASSIGN_OR_RETURN(std::vector<audit::StoredAuditEvent> events, log_->List(query));
  v1::ListAuditEventsResponse response;
  for (size_t i = 0; i < events.size() && i < static_cast<size_t>(page_size); ++i) {
    *response.add_events() = std::move(events[i].event);
  }
  if (events.size() > static_cast<size_t>(page_size)) {
    response.set_next_page_token(AuditPageToken(events[page_size - 1].id, filter));
  }
  return response;
}

}  // namespace gradhub::api
