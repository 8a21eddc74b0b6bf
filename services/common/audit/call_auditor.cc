#include "services/common/audit/call_auditor.h"

#include <prometheus/counter.h>
#include <prometheus/registry.h>

#include <iostream>

#include "absl/strings/str_cat.h"
#include "services/common/audit/audited_calls.h"

namespace gradhub::audit {

CallAuditor::CallAuditor(const api::Authenticator* auth, AuditLog* log, CallAuditorOptions options)
    : auth_(auth), log_(log), options_(std::move(options)) {
  if (!options_.log) {
    options_.log = [name = options_.server_name](const std::string& line) {
      std::cerr << name << ": " << line << std::endl;
    };
  }
  if (options_.registry == nullptr) return;
  auto* failures = &prometheus::BuildCounter()
                        .Name("gradhub_audit_write_failures_total")
                        .Help(
                            "Audited calls whose audit_events row could not be written "
                            "(the call kept its outcome; the event is in the log)")
                        .Register(*options_.registry);
  // Every series from the start at 0, so an alert on increase() sees the first failure.
  for (const AuditedRpc& rpc : AuditedRpcs()) failures->Add({{"method", std::string(rpc.method)}});
  count_failure_ = [failures](const std::string& method) {
    failures->Add({{"method", method}}).Increment();
  };
}

AuditRecord CallAuditor::EventOf(const FinishedCall& call) const {
  // The handler authenticated the same header a moment ago: a cache hit for tenant tokens.
  const absl::StatusOr<api::Principal> caller = auth_->Authenticate(call.authorization);
  AuditRecord record;
  record.actor = ActorName(caller);
  record.resource = BoundedText(call.resource, kMaxNameChars);
  record.tenant = BoundedText(TenantOf(caller, record.resource), kMaxNameChars);
  if (record.tenant.empty()) record.job_id = JobOfResource(record.resource);
  record.method = std::string(call.method);
  record.outcome = OutcomeName(call.outcome.code());
  record.message = BoundedText(call.outcome.message(), kMaxMessageChars);
  record.transport = std::string(call.transport);
  record.peer = BoundedText(call.peer, kMaxNameChars);
  return record;
}

void CallAuditor::Record(const FinishedCall& call) {
  if (call.outcome.ok()) {
    const AuditedRpc* rpc = FindAuditedRpc(call.method);
    if (rpc != nullptr && rpc->ok_event_written_by_handler) return;
  }
  const AuditRecord record = EventOf(call);
  const absl::Status written = log_->Append(record);
  if (written.ok()) return;
  write_failures_.fetch_add(1);
  if (count_failure_) count_failure_(record.method);
  options_.log(absl::StrCat("audit event lost (", written.ToString(), "): actor=", record.actor,
                            " tenant=", record.tenant, " method=", record.method,
                            " resource=", record.resource, " outcome=", record.outcome,
                            " transport=", record.transport, " peer=", record.peer));
}

}  // namespace gradhub::audit
