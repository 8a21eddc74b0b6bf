// The trainer's seams to the services (ARCHITECTURE.md): the trainer runs without them, and
// the checkpoint store and metrics service plug in here when they exist.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

namespace gradhub::trainer {

// One reporting interval of rank 0 (or any rank) for telemetry.
struct StepReport {
  int64_t step = 0;
  int64_t epoch = 0;
  double loss = 0;
  double learning_rate = 0;
  double samples_per_second = 0;  // global, all ranks
  double forward_seconds = 0, backward_seconds = 0, allreduce_wait_seconds = 0,
         optimizer_seconds = 0, step_seconds = 0;  // per step, averaged over the interval
  int64_t allreduce_bytes = 0;                     // per step
  int buckets = 0;
  std::map<std::string, double> eval_metrics;      // set on evaluation steps
};

class TelemetrySink {
 public:
  virtual ~TelemetrySink() = default;
  virtual void Report(const StepReport& report) = 0;
};

struct Checkpoint {
  int64_t step = 0;
  std::string bytes;
};

// Where checkpoints go. Save must be atomic: a reader sees a whole checkpoint or none.
class CheckpointSink {
 public:
  virtual ~CheckpointSink() = default;
  virtual void Save(const Checkpoint& checkpoint) = 0;
  // The newest intact checkpoint; corrupt ones are skipped (and reported on stderr).
  virtual std::optional<Checkpoint> LoadLatest() = 0;
};

}  // namespace gradhub::trainer
