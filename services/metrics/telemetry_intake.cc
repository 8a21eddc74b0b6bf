#include "services/metrics/telemetry_intake.h"

#include "absl/strings/str_cat.h"
#include "services/common/status_macros.h"
#include "services/metrics/job_directory.h"

namespace gradhub::metrics {

absl::StatusOr<TelemetrySender> SenderFor(const api::Principal& principal) {
  using Kind = api::Principal::Kind;
  switch (principal.kind) {
    case Kind::kAdmin:
      return TelemetrySender{};
    case Kind::kJob:
      return TelemetrySender{
          TelemetrySender::Rank{principal.job_id, principal.attempt, principal.rank}};
    case Kind::kNode:
    case Kind::kTenant:
      break;
  }
  return absl::PermissionDeniedError("telemetry takes a rank's job token or the admin token");
}

bool MustRecheckSender(const TelemetrySender& sender, absl::Time checked, absl::Time now) {
  return sender.only.has_value() && now - checked >= kSenderRecheck;
}

absl::StatusOr<TelemetrySender> AuthorizeSender(const api::Authenticator& auth,
                                                const std::string& authorization) {
  GRADHUB_ASSIGN_OR_RETURN(const api::Principal principal, auth.Authenticate(authorization));
  return SenderFor(principal);
}

absl::Status ValidateBatch(const v1::TelemetryBatch& batch) {
  if (JobIdOf(batch.job()).empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("job: '", batch.job(), "' is not jobs/<job id>"));
  }
  if (batch.attempt() < 1) return absl::InvalidArgumentError("attempt: must be at least 1");
  if (batch.rank() < 0) return absl::InvalidArgumentError("rank: must not be negative");
  for (int i = 0; i < batch.steps_size(); ++i) {
    if (batch.steps(i).pipeline_stage() < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("steps[", i, "].pipeline_stage: must not be negative"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckSender(const TelemetrySender& sender, const v1::TelemetryBatch& batch) {
  if (!sender.only) return absl::OkStatus();
  const TelemetrySender::Rank& own = *sender.only;
  const std::string own_job = absl::StrCat("jobs/", own.job_id);
  if (JobIdOf(batch.job()) != own.job_id) {
    return absl::PermissionDeniedError(absl::StrCat(
        "job: the token of ", own_job, " reports for that job only, not ", batch.job()));
  }
  if (batch.attempt() != own.attempt) {
    return absl::PermissionDeniedError(absl::StrCat("attempt: the token of attempt ", own.attempt,
                                                    " of ", own_job, " reports for it only, not ",
                                                    batch.attempt()));
  }
  if (batch.rank() != own.rank) {
    return absl::PermissionDeniedError(absl::StrCat("rank: the token of rank ", own.rank, " of ",
                                                    own_job, " reports for it only, not ",
                                                    batch.rank()));
  }
  return absl::OkStatus();
}

absl::StatusOr<BatchOutcome> IngestBatch(TrainingMetrics& metrics, const TelemetrySender& sender,
                                         const v1::TelemetryBatch& batch) {
  if (absl::Status valid = ValidateBatch(batch); !valid.ok()) {
    metrics.CountDropped(DropReason::kInvalid, batch.steps_size());
    return valid;
  }
  GRADHUB_RETURN_IF_ERROR(CheckSender(sender, batch));
  return metrics.Record(batch);
}

}  // namespace gradhub::metrics
