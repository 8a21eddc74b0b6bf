// `gradhub admin audit`: the audit log (AuditService.ListAuditEvents on gradhub-api). Listed in
// AllCommands (commands.cc).
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "services/cli/invocation.h"

namespace gradhub::cli {

// What the command's flags select.
struct AuditSelection {
  std::string tenant = "";  // tenants/<id> or <id>
  std::string actor = "";
  std::string method = "";  // a full rpc name (gradhub.v1.JobService/CancelJob) or CancelJob
  std::string resource = "";
  std::string outcome = "";  // OK or a gRPC code name, any case
};

// The ListAuditEvents filter (`tenant=tenants/a outcome=NOT_FOUND`) for `selection`; its
// grammar has no quoting, so a value with a space or '=' is INVALID_ARGUMENT naming the flag.
// The server checks the rest (a tenant's form, an outcome's name).
absl::StatusOr<std::string> AuditFilterFor(const AuditSelection& selection);

// `admin audit [--tenant T] [--actor A] [--method M] [--resource R] [--outcome O] [--limit N]`:
// the newest N events that match, as a table or (`-o json`, short for the global `--output
// json`) a ListAuditEventsResponse. The admin token reads every tenant's events, a tenant token
// its own tenant's.
int AdminAudit(Invocation& inv);

}  // namespace gradhub::cli
