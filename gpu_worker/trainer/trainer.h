#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <iosfwd>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>

#include "gpu_worker/ddp/store.h"
#include "gpu_worker/trainer/sinks.h"
#include "gradhub/v1/jobs.pb.h"

namespace gradhub::trainer {

// The loss became NaN or infinite (a job failure: bad learning rate, bad data).
class TrainingFailure : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The trainer was asked to stop (SIGTERM: preemption, drain, cancel) and did: rank 0 saved a
// checkpoint of the last finished step first, when it had a sink and the grace allowed.
class Preempted : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct TrainerOptions {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  // Rendezvous of this attempt, already scoped (PrefixStore) by job and attempt.
  std::shared_ptr<ddp::Store> store;
  // Rank 0 saves through it (on a background thread) and resumes from it. Null: no
  // checkpoints, no resume. Other ranks get the resumed state from rank 0 and need none.
  std::shared_ptr<CheckpointSink> checkpoints;
  std::shared_ptr<TelemetrySink> telemetry;  // null: progress lines only
  // Intra-op threads of this rank; 0 = the machine's cores divided among its local ranks.
  int threads = 0;
  std::chrono::milliseconds collective_timeout = std::chrono::seconds(60);
  // Set (by a SIGTERM handler) when the trainer should stop. Rank 0 then finishes its step,
  // saves, waits up to preempt_grace for the commit and throws Preempted. Other ranks keep
  // training until rank 0 has gone (their next collective fails) or preempt_grace has passed.
  const std::atomic<bool>* stop_requested = nullptr;
  std::chrono::milliseconds preempt_grace = std::chrono::seconds(8);
  // Machine-readable progress (one JSON object per line, rank 0 only) and human-readable log.
  std::ostream* progress = nullptr;
  std::ostream* log = nullptr;
};

struct TrainResult {
  int64_t steps = 0;
  int64_t resumed_from_step = -1;  // -1: started from scratch
  // Rank 0: checkpoints taken, and the training time they cost: the snapshot (the state
  // serialized into host memory) and the wait for a previous upload still running.
  int64_t checkpoints_saved = 0;
  double checkpoint_snapshot_seconds = 0;
  double checkpoint_wait_seconds = 0;
  double final_loss = 0;
  std::map<std::string, double> eval_metrics;  // of the final evaluation
  std::string parameters_sha256;               // of every parameter's bytes, in order
};

// Trains the job on this rank until max_steps / max_epochs, resuming from the newest
// checkpoint when rank 0's sink has one. Throws UserError (spec, data, shapes, a checkpoint
// of another spec), TrainingFailure (NaN), Preempted, ddp::CommError / ddp::StoreError (peers,
// rendezvous) and std::runtime_error (I/O, a final checkpoint that could not be saved).
TrainResult Train(const v1::JobSpec& spec, const TrainerOptions& options);

}  // namespace gradhub::trainer
