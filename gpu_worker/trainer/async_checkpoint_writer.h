// Saves checkpoints on a background thread, so the training loop never waits on the network
// or the disk, only (rarely) on the save before.
//
// Protocol:
//   1. Submit(checkpoint) waits while the previous save is still running (at most one is in
//      flight: a second would only queue behind it and double the memory), then hands the
//      bytes to the thread and returns.
//   2. The thread calls the sink's Save, which retries on its own, and records the outcome.
//   3. Flush(timeout) waits for the save in flight, for a final checkpoint or a preemption.
// A failed save does not stop training (the previous checkpoint is still there); it is logged,
// and Flush reports it so the last save of a run is never lost silently.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <iosfwd>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "gpu_worker/trainer/sinks.h"

namespace gradhub::trainer {

struct SaveOutcome {
  int64_t step = -1;
  double seconds = 0;  // the sink's Save, retries included
  std::string error;   // empty on success
};

// Thread-compatible: called from the training thread only.
class AsyncCheckpointWriter {
 public:
  AsyncCheckpointWriter(std::shared_ptr<CheckpointSink> sink, std::ostream* log);
  // Waits for the save in flight (a checkpoint is not thrown away), then stops the thread.
  ~AsyncCheckpointWriter();

  // Step 1. Returns the seconds spent waiting for the previous save.
  double Submit(Checkpoint checkpoint);
  // Step 3. The outcome of the last save once it has ended; nullopt if it is still running
  // after `timeout`.
  std::optional<SaveOutcome> Flush(std::chrono::milliseconds timeout);
  // The newest step submitted (saved or in flight); -1 before any.
  int64_t last_submitted_step() const { return last_submitted_step_; }
  // The outcome of the last save that ended, without waiting.
  SaveOutcome last_outcome() const;

 private:
  void Run();

  std::shared_ptr<CheckpointSink> sink_;
  std::ostream& log_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::optional<Checkpoint> pending_;  // handed over, not yet picked up or still saving
  bool busy_ = false;                  // a save is running (pending_ or in Save)
  bool stopping_ = false;
  SaveOutcome last_;
  int64_t last_submitted_step_ = -1;
  std::thread thread_;
};

}  // namespace gradhub::trainer
