// Saves checkpoints on a background thread, so the training loop never waits on the network
// or the disk: not on a save that cannot go out (the store unreachable, a slow link), and not
// on the save before, except for the checkpoints that must not be lost.
//
// Protocol:
//   1. A checkpoint comes due. While the previous save is still in flight (in_flight() says
//      which step and for how long), SkipCheckpoint decides: a periodic checkpoint is skipped,
//      and the caller says so (rank 0's log and the job's CHECKPOINT_SKIPPED event); the next
//      one that comes due once the save has ended goes out as usual. At most one save is in
//      flight and none waits behind it: a queued copy would double the memory and could only
//      go out after the one ahead, which is what the next periodic checkpoint does anyway.
//   2. Submit(checkpoint) hands the bytes to the thread and returns. For a checkpoint that
//      must not be lost (the final one, a preemption's) it first waits for the save in flight.
//   3. The thread calls the sink's Save, which retries on its own (through an outage of the
//      store: the upload resumes at the store's offset once it is back), and records the
//      outcome. Its priority:
//      a. It saves at the scheduler's idle priority (SCHED_IDLE). A save is background work;
//         on a node whose cores all train, its CRC, framing and sends took a core from a
//         training thread, which then held up the others at their next barrier (a 160 MiB
//         save took 0.41 s from training besides its snapshot at normal priority, 0.22 s at
//         idle: tests/bench/checkpoint/training_stall.sh). It gets what training leaves idle.
//      b. A save the training thread waits for (Submit of one that must not be lost, Flush,
//         the destructor) goes back to normal priority until it ends: on cores that other
//         processes keep busy, an idle save could starve while the loop waits on it, as in a
//         preemption's grace. Raising a thread needs RLIMIT_NICE >= 20, which the agent gives
//         ranks (rank_process.h).
//      c. Threads a save started inherit its priority. Once it has ended, every other thread
//         of the process at idle priority goes back to normal: gRPC grows its pools from
//         whichever thread calls it, and its threads serve every channel.
//      d. All of it only where the thread may go back to normal (tried once at start). Where
//         it may not (a rank without RLIMIT_NICE 20: an agent without CAP_SYS_RESOURCE, as in
//         a container), saves run at normal priority, as the log says: an idle save that
//         training waits for starved on cores that other jobs' ranks kept busy, and a drain's
//         SIGTERM checkpoint missed its grace (checkpoint_e2e_test).
//      A slower save costs nothing while the cores have room; one that outlasts the interval
//      makes the next periodic checkpoint skip (step 1).
//   4. Flush(timeout) waits for the save in flight, for a final checkpoint or a preemption.
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

// The save a writer is running, as a skipped checkpoint reports it.
struct InFlightSave {
  int64_t step = -1;
  double seconds = 0;  // since it was handed to the writer
};

// What a checkpoint that comes due while a save is in flight may do (step 1).
enum class SaveUrgency {
  kSkippable,  // a periodic checkpoint: skipped, training goes on
  kMustSave,   // the final checkpoint, a preemption's: waits for the save in flight
};

// Step 1's rule, without state: whether the checkpoint is skipped.
inline bool SkipCheckpoint(SaveUrgency urgency, const std::optional<InFlightSave>& in_flight) {
  return urgency == SaveUrgency::kSkippable && in_flight.has_value();
}

// Step 3d's question: whether a thread of this process may go to idle priority and back to
// normal (RLIMIT_NICE >= 20, or CAP_SYS_NICE). The writer asks it once, at construction.
bool ThreadsMayLeaveIdlePriority();

// Thread-compatible: called from the training thread only.
class AsyncCheckpointWriter {
 public:
  AsyncCheckpointWriter(std::shared_ptr<CheckpointSink> sink, std::ostream* log);
  // Waits for the save in flight (a checkpoint is not thrown away), then stops the thread.
  ~AsyncCheckpointWriter();

  // Step 1: the save in flight; nullopt when the writer is idle.
  std::optional<InFlightSave> in_flight() const;
  // Step 2. Returns the seconds spent waiting for the previous save (0 unless one was in
  // flight: call it for a skippable checkpoint only after SkipCheckpoint said no).
  double Submit(Checkpoint checkpoint);
  // Step 4. The outcome of the last save once it has ended; nullopt if it is still running
  // after `timeout`.
  std::optional<SaveOutcome> Flush(std::chrono::milliseconds timeout);
  // The newest step submitted (saved or in flight); -1 before any.
  int64_t last_submitted_step() const { return last_submitted_step_; }
  // The outcome of the last save that ended, without waiting.
  SaveOutcome last_outcome() const;

 private:
  using Clock = std::chrono::steady_clock;

  void Run();
  // With mutex_ held, before the training thread waits for the save in flight (step 3).
  void HoldInFlightSaveAtNormalPriority();

  std::shared_ptr<CheckpointSink> sink_;
  std::ostream& log_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::optional<Checkpoint> pending_;  // handed over, not yet picked up or still saving
  bool busy_ = false;                  // a save is running (pending_ or in Save)
  bool stopping_ = false;
  bool boosted_ = false;  // the save in flight runs at normal priority (3b)
  SaveOutcome last_;
  int64_t last_submitted_step_ = -1;
  Clock::time_point submitted_at_;  // of last_submitted_step_
  const bool idle_saves_;           // step 3d: saves may run at idle priority
  std::thread thread_;              // declared last: started once the rest exists
};

}  // namespace gradhub::trainer
