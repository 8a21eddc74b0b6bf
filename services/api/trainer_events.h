// Job events that rank 0 reports in its progress records (services/common/contract/
// progress_record.h) rather than the control plane deciding them: today a skipped checkpoint.
// NodeManager::StoreLogs appends them in the transaction that stores the lines:
//   1. ParseSkippedCheckpoint picks the checkpoint_skipped records out of rank 0's stdout.
//   2. RecordSkippedCheckpoints appends one CHECKPOINT_SKIPPED event per skipped step of the
//      job's current attempt, with rank 0, the step and SkippedCheckpointMessage. An agent
//      ships a batch again when it saw no answer: a unique index over (job, attempt, step)
//      keeps the event from repeating. Lines of an attempt that is no longer current add none,
//      as they add no progress.
//
// Free functions without state; thread-safe as far as their arguments are.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "services/common/db/pool.h"

namespace gradhub::api {

struct SkippedCheckpoint {
  int64_t step = 0;            // whose checkpoint was skipped
  int64_t in_flight_step = 0;  // the upload still going out
  double in_flight_seconds = 0;
};

// nullopt for any line but a well-formed checkpoint_skipped record (a prefix test first, so
// call it on every line).
std::optional<SkippedCheckpoint> ParseSkippedCheckpoint(const std::string& line);

// "checkpoint at step N skipped: the upload of step M has been going out for X s".
std::string SkippedCheckpointMessage(const SkippedCheckpoint& skipped);

// Step 2, inside the caller's transaction; `job_id` is a uuid.
absl::Status RecordSkippedCheckpoints(db::Transaction& tx, const std::string& job_id,
                                      int32_t attempt,
                                      const std::vector<SkippedCheckpoint>& skipped);

}  // namespace gradhub::api
