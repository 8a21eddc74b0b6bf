#pragma once

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

struct TrainerOptions {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  // Rendezvous of this attempt, already scoped (PrefixStore) by job and attempt.
  std::shared_ptr<ddp::Store> store;
  std::shared_ptr<CheckpointSink> checkpoints;  // null: no checkpoints, no resume
  std::shared_ptr<TelemetrySink> telemetry;     // null: progress lines only
  // Intra-op threads of this rank; 0 = the machine's cores divided among its local ranks.
  int threads = 0;
  std::chrono::milliseconds collective_timeout = std::chrono::seconds(60);
  // Machine-readable progress (one JSON object per line, rank 0 only) and human-readable log.
  std::ostream* progress = nullptr;
  std::ostream* log = nullptr;
};

struct TrainResult {
  int64_t steps = 0;
  int64_t resumed_from_step = -1;  // -1: started from scratch
  double final_loss = 0;
  std::map<std::string, double> eval_metrics;  // of the final evaluation
  std::string parameters_sha256;               // of every parameter's bytes, in order
};

// Trains the job on this rank until max_steps / max_epochs, resuming from the newest
// checkpoint when the sink has one. Throws UserError (spec, data, shapes), TrainingFailure
// (NaN), ddp::CommError / ddp::StoreError (peers, rendezvous) and std::runtime_error (I/O).
TrainResult Train(const v1::JobSpec& spec, const TrainerOptions& options);

}  // namespace gradhub::trainer
