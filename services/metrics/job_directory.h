// What the metrics service needs to know of a job it receives telemetry for: whether it exists,
// its current attempt, its world size (ranks outside it are refused) and whether it has ended.
// An interface, so that TrainingMetrics is tested without a database; PostgresJobDirectory reads
// the api's `jobs` table.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "services/common/db/pool.h"

namespace gradhub::metrics {

struct JobStatus {
  int32_t current_attempt = 0;
  int32_t world_size = 0;
  bool terminal = false;  // SUCCEEDED, FAILED or CANCELLED
};

class JobDirectory {
 public:
  virtual ~JobDirectory() = default;
  // The jobs among `job_ids` (bare uuids) that exist, by id; an id that is absent from the
  // result is no job. An error only when the directory cannot be read. Thread-safe.
  virtual absl::StatusOr<std::map<std::string, JobStatus>> Lookup(
      const std::vector<std::string>& job_ids) = 0;
};

class PostgresJobDirectory final : public JobDirectory {
 public:
  explicit PostgresJobDirectory(db::Pool* pool) : pool_(pool) {}  // not owned
  absl::StatusOr<std::map<std::string, JobStatus>> Lookup(
      const std::vector<std::string>& job_ids) override;

 private:
  db::Pool* pool_;
};

// "jobs/<uuid>" -> "<uuid>" (lowercase); empty when `name` is not one.
std::string JobIdOf(const std::string& name);

}  // namespace gradhub::metrics
