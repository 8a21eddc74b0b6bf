#include "services/cli/audit_commands.h"

#include <algorithm>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace gradhub::cli {
namespace {

// The most events one invocation prints, and the server's largest page.
constexpr int64_t kMaxLimit = 100000;
constexpr int64_t kMaxPageSize = 1000;

// Up to `limit` events, newest first, over as many pages as it takes; *more tells whether the
// log holds more that match.
grpc::Status ReadEvents(Invocation& inv, const std::string& filter, int64_t limit,
                        v1::ListAuditEventsResponse* events, bool* more) {
  v1::ListAuditEventsRequest request;
  request.set_filter(filter);
  *more = false;
  while (events->events_size() < limit) {
    request.set_page_size(
        static_cast<int32_t>(std::min(limit - events->events_size(), kMaxPageSize)));
    v1::ListAuditEventsResponse page;
    grpc::Status status =
        inv.client().audit().ListAuditEvents(inv.client().UnaryContext().get(), request, &page);
    if (!status.ok()) return status;
    for (v1::AuditEvent& event : *page.mutable_events()) *events->add_events() = std::move(event);
    *more = !page.next_page_token().empty();
    if (!*more) break;
    if (page.next_page_token() == request.page_token()) {
      // A server that hands back the token it was given would keep us here forever.
      return grpc::Status(grpc::StatusCode::INTERNAL,
                          "the server returned the same page token twice");
    }
    request.set_page_token(page.next_page_token());
  }
  return grpc::Status::OK;
}

}  // namespace

absl::StatusOr<std::string> AuditFilterFor(const AuditSelection& selection) {
  const std::string tenant = selection.tenant.empty() || selection.tenant.rfind("tenants/", 0) == 0
                                 ? selection.tenant
                                 : "tenants/" + selection.tenant;
  std::vector<std::string> terms;
  for (const auto& [key, value] : std::vector<std::pair<std::string, std::string>>{
           {"tenant", tenant},
           {"actor", selection.actor},
           {"method", selection.method},
           {"resource", selection.resource},
           {"outcome", absl::AsciiStrToUpper(selection.outcome)}}) {
    if (value.empty()) continue;
    if (value.find_first_of(" =") != std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", key, ": '", value, "' may not contain spaces or '='"));
    }
    terms.push_back(absl::StrCat(key, "=", value));
  }
  return absl::StrJoin(terms, " ");
}

int AdminAudit(Invocation& inv) {
  AuditSelection selection;
  int64_t limit = 50;
  inv.flags()
      .String("tenant", "", &selection.tenant, "Only events of this tenant (tenants/<id> or <id>)")
      .String("actor", "", &selection.actor,
              "Only calls by this actor: admin, unauthenticated, or a token's name "
              "(tenants/<id>/tokens/<id>)")
      .String("method", "", &selection.method,
              "Only calls of this rpc (CancelJob, or gradhub.v1.JobService/CancelJob)")
      .String("resource", "", &selection.resource, "Only calls on this resource (jobs/<id>, ...)")
      .String("outcome", "", &selection.outcome, "Only calls that ended so (OK, NOT_FOUND, ...)")
      .Int("limit", "", &limit, "The newest N events (1 to 100000)");
  inv.ShortFlag("-o", "--output");  // `-o json`, as kubectl and the issue write it
  if (!inv.Parse(0, 0)) return inv.exit_code();
  if (limit < 1 || limit > kMaxLimit) {
    return inv.UsageError(absl::StrCat("--limit: ", limit, " is not between 1 and ", kMaxLimit));
  }
  const absl::StatusOr<std::string> filter = AuditFilterFor(selection);
  if (!filter.ok()) return inv.UsageError(std::string(filter.status().message()));
  v1::ListAuditEventsResponse events;
  bool more = false;
  const grpc::Status status = ReadEvents(inv, *filter, limit, &events, &more);
  if (!status.ok()) return inv.Fail(status);
  if (inv.format() == Format::kJson) {
    inv.out() << ToJson(events);
    return kOk;
  }
  std::vector<const v1::AuditEvent*> rows;
  for (const v1::AuditEvent& event : events.events()) rows.push_back(&event);
  inv.out() << AuditEventsTable(rows);
  // On stderr, so that stdout stays the table.
  if (more) inv.err() << "(more events match: raise --limit)\n";
  return kOk;
}

}  // namespace gradhub::cli
