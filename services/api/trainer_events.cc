#include "services/api/trainer_events.h"

#include <cstdio>
#include <string_view>

#include "gradhub/v1/jobs.pb.h"
#include "services/common/contract/progress_record.h"
#include "services/common/status_macros.h"

namespace gradhub::api {

std::optional<SkippedCheckpoint> ParseSkippedCheckpoint(const std::string& line) {
  static constexpr std::string_view kPrefix = R"({"event":"checkpoint_skipped")";
  if (std::string_view(line).substr(0, kPrefix.size()) != kPrefix) return std::nullopt;
  const std::optional<ProgressRecord> record = ParseProgressRecord(line);
  if (!record || record->event != ProgressEvent::kCheckpointSkipped ||
      !record->checkpoint_in_flight_step) {
    return std::nullopt;
  }
  SkippedCheckpoint skipped;
  skipped.step = record->step;
  skipped.in_flight_step = *record->checkpoint_in_flight_step;
  skipped.in_flight_seconds = record->checkpoint_in_flight_seconds.value_or(0);
  return skipped;
}

std::string SkippedCheckpointMessage(const SkippedCheckpoint& skipped) {
  char seconds[32];
  std::snprintf(seconds, sizeof(seconds), "%.1f", skipped.in_flight_seconds);
  return "checkpoint at step " + std::to_string(skipped.step) + " skipped: the upload of step " +
         std::to_string(skipped.in_flight_step) + " has been going out for " + seconds + " s";
}

absl::Status RecordSkippedCheckpoints(db::Transaction& tx, const std::string& job_id,
                                      int32_t attempt,
                                      const std::vector<SkippedCheckpoint>& skipped) {
  for (const SkippedCheckpoint& s : skipped) {
    GRADHUB_RETURN_IF_ERROR(
        tx.Exec("INSERT INTO job_events (job_id, attempt, type, message, rank, checkpoint_step)"
                " SELECT j.id, $2, $3, $4, 0, $5 FROM jobs j"
                " WHERE j.id = $1::uuid AND j.current_attempt = $2"
                " ON CONFLICT (job_id, attempt, checkpoint_step)"
                "   WHERE type = 'CHECKPOINT_SKIPPED' DO NOTHING",
                {job_id, attempt, v1::JobEvent::Type_Name(v1::JobEvent::CHECKPOINT_SKIPPED),
                 SkippedCheckpointMessage(s), s.step})
            .status());
  }
  return absl::OkStatus();
}

}  // namespace gradhub::api
