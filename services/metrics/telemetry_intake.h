// Telemetry's way in, shared by both adapters (TelemetryService's gRPC stream and the HTTP
// endpoint's POST /v1/telemetry), so that who may send what cannot drift between them. A batch,
// in order:
//   1. The caller's token says what it may send (TelemetrySender): the admin token, any job's
//      batches; a job token (every rank's, trainer or script: IssueRankCredential), only
//      batches of its own job, attempt and rank; a tenant or a node token, nothing
//      (PERMISSION_DENIED). Checked once per POST, and at the start of a gRPC stream and again
//      at least every kSenderRecheck while a job token's stream lasts (MustRecheckSender): a
//      job token is refused once its attempt is not the job's current one or the job ended
//      (Authenticator), so such a stream ends UNAUTHENTICATED within that time.
//   2. The batch must name a job as jobs/<uuid>, attempt >= 1 and rank >= 0 (INVALID_ARGUMENT
//      naming the field; its steps count as dropped, reason invalid).
//   3. It must be the sender's to send (PERMISSION_DENIED naming the field).
//   4. TrainingMetrics::Record keeps or drops its steps by the rules of training_metrics.h.
//
// Thread-safe as TrainingMetrics and Authenticator are: no state of its own.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gradhub/v1/telemetry.pb.h"
#include "services/common/auth/authenticator.h"
#include "services/metrics/training_metrics.h"

namespace gradhub::metrics {

// What a caller may report (rule 1).
struct TelemetrySender {
  // The one rank a job token reports for.
  struct Rank {
    std::string job_id;  // the uuid, lowercase
    int32_t attempt = 0;
    int32_t rank = 0;
  };
  // Unset: any job's batches (the admin token).
  std::optional<Rank> only;
};

// Rule 1 as both adapters take it: what the `authorization` header value may report, or why
// nothing. AuthorizeSender in the server; tests may pass their own.
using AuthorizeTelemetry =
    std::function<absl::StatusOr<TelemetrySender>(const std::string& authorization)>;

// Rule 1 for an authenticated principal.
absl::StatusOr<TelemetrySender> SenderFor(const api::Principal& principal);
// Rule 1 for the `authorization` header value ("Bearer <token>"): UNAUTHENTICATED as
// Authenticator::Authenticate, PERMISSION_DENIED for a tenant's or a node's token.
absl::StatusOr<TelemetrySender> AuthorizeSender(const api::Authenticator& auth,
                                                const std::string& authorization);

// How long a job token's stream goes on without asking again: the Authenticator's cache time,
// so that a job token's stream ends no later than a cached token's revocation takes effect.
inline constexpr absl::Duration kSenderRecheck = api::Authenticator::kTokenCacheTtl;

// Rule 1 on a stream: whether `sender`, authorized at `checked`, must be authorized again
// before its next batch at `now` (a job token's, kSenderRecheck later; the admin's never).
bool MustRecheckSender(const TelemetrySender& sender, absl::Time checked, absl::Time now);

// Rule 2: INVALID_ARGUMENT naming the first malformed field of `batch`, else OK.
absl::Status ValidateBatch(const v1::TelemetryBatch& batch);

// Rule 3, for a batch that passed rule 2.
absl::Status CheckSender(const TelemetrySender& sender, const v1::TelemetryBatch& batch);

// Rules 2 to 4: the batch's outcome, or the error of rule 2 or 3 (nothing recorded then).
absl::StatusOr<BatchOutcome> IngestBatch(TrainingMetrics& metrics, const TelemetrySender& sender,
                                         const v1::TelemetryBatch& batch);

}  // namespace gradhub::metrics
