// The trainer's seams to the services (docs/architecture.md): the trainer runs without them,
// and the checkpoint store and metrics service plug in here when they exist.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "gpu_worker/trainer/checkpoint_bytes.h"

namespace gradhub::trainer {

// A pipeline stage's share of a step (JobSpec.parallelism; telemetry.proto's fields of the
// same names); zero without pipeline stages.
struct PipelineStepFigures {
  int stage = 0;
  int64_t p2p_bytes = 0;        // sent to and received from the neighbouring stages
  double p2p_wait_seconds = 0;  // blocked in receives, and waiting for sends to end
  double bubble_fraction = 0;   // (step - forward - backward) / step, of the stage's steps
  int64_t peak_activation_bytes = 0;
};

// One optimizer step of one rank (telemetry), or the average over a progress interval
// (rank 0's progress lines, where loss and samples_per_second are the whole job's).
struct StepReport {
  int64_t step = 0;  // steps done, so the first step is 1
  int64_t epoch = 0;
  double loss = 0;
  double learning_rate = 0;
  int64_t samples = 0;  // this rank's, all micro-batches
  double samples_per_second = 0;
  double forward_seconds = 0, backward_seconds = 0, allreduce_wait_seconds = 0,
         optimizer_seconds = 0, step_seconds = 0;
  int64_t allreduce_bytes = 0;
  // Sum over buckets of each allreduce's run time (overlaps backward).
  double allreduce_seconds = 0;
  int buckets = 0;
  int world_size = 1;
  // The training time a checkpoint of this step cost (snapshot and wait); 0 when none.
  double checkpoint_save_seconds = 0;
  std::map<std::string, double> eval_metrics;  // set on evaluation steps
  PipelineStepFigures pipeline;
};

// As nccl-tests define it: the algorithm bandwidth times 2 (n - 1) / n, comparable with the
// link's bandwidth whatever the world size. 0 without time or without peers.
inline double BusBandwidth(int64_t bytes, double seconds, int world_size) {
  if (seconds <= 0 || world_size < 2) return 0;
  return static_cast<double>(bytes) / seconds * 2.0 * (world_size - 1) / world_size;
}

// Where per-step telemetry goes. Report is called once per step on every rank, from the
// training thread: it must not block (queue and return).
class TelemetrySink {
 public:
  virtual ~TelemetrySink() = default;
  virtual void Report(const StepReport& report) = 0;
};

struct Checkpoint {
  int64_t step = 0;
  // In memory, or a mapped file (a pipeline's, or one a sink downloaded to its cache).
  CheckpointBytes bytes;
};

// Where checkpoints go. Save must be atomic: a reader sees a whole checkpoint or none. Both
// directions may stream through files, for checkpoints that do not fit a rank's memory twice.
class CheckpointSink {
 public:
  virtual ~CheckpointSink() = default;
  virtual void Save(const Checkpoint& checkpoint) = 0;
  // The newest intact checkpoint; corrupt ones are skipped (and reported on stderr).
  virtual std::optional<Checkpoint> LoadLatest() = 0;
};

}  // namespace gradhub::trainer
