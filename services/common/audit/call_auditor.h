// The recorder every server's transports call once per finished audited call (grpc_audit.h,
// http_audit.h): it resolves who made the call and which tenant it belongs to
// (audited_calls.h), and appends the row to the AuditLog before the call's answer is sent.
//
// A row that cannot be written does not change the call's outcome: by then the call has done
// what it did (a job was created or cancelled, a token revoked), and answering an error would
// tell the client that it had not, so that it retries a change that happened. Instead the
// failure is logged with the event it lost and counted in
// gradhub_audit_write_failures_total{method}, which an alert watches. (Refusing the call
// instead would take writing the row in the call's own transaction, inside every manager.
// CreateJob, the one hot call, does just that: see AuditedRpc::ok_event_written_by_handler.)
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "services/common/audit/audit_log.h"
#include "services/common/auth/authenticator.h"

namespace prometheus {
class Registry;
}

namespace gradhub::audit {

// What a transport saw of one call.
struct FinishedCall {
  std::string_view method = "";     // an AuditedRpc's method
  std::string authorization = "";   // the `authorization` header or metadata, "" when absent
  std::string_view transport = "";  // "grpc" or "rest"
  std::string peer = "";            // host:port
  std::string resource = "";        // ResourceOf(...)
  absl::Status outcome = absl::OkStatus();
};

struct CallAuditorOptions {
  // Where gradhub_audit_write_failures_total is registered (the server's /metrics registry);
  // nullptr = counted in write_failures() only.
  prometheus::Registry* registry = nullptr;
  std::string server_name = "gradhub";
  // Where a lost event is reported; empty = stderr, prefixed with `server_name`.
  std::function<void(const std::string& line)> log = nullptr;
};

// Thread-safe: Record is called from every request thread at once; it keeps no state but the
// failure counters (atomic).
class CallAuditor {
 public:
  // Not owned; both must outlive this.
  CallAuditor(const api::Authenticator* auth, AuditLog* log, CallAuditorOptions options = {});

  // Writes the call's row; never fails the call (see the top). Not the OK outcome of an rpc
  // whose handler writes that event itself (AuditedRpc::ok_event_written_by_handler).
  void Record(const FinishedCall& call);

  // The event Record would write for `call`, for a handler that writes its OK event itself
  // (see above): it builds it from the call before acting (outcome OK, resource "" until the
  // handler names what it made) and writes it in its own transaction.
  AuditRecord EventOf(const FinishedCall& call) const;

  // Rows that could not be written since the start.
  int64_t write_failures() const { return write_failures_.load(); }

 private:
  const api::Authenticator* auth_;
  AuditLog* log_;
  CallAuditorOptions options_;
  // Increments gradhub_audit_write_failures_total{method}; empty without a registry.
  std::function<void(const std::string& method)> count_failure_;
  std::atomic<int64_t> write_failures_{0};
};

}  // namespace gradhub::audit
