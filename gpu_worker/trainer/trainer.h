#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "gpu_worker/ddp/mixed_precision.h"
#include "gpu_worker/ddp/store.h"
#include "gpu_worker/trainer/errors.h"
#include "gpu_worker/trainer/sinks.h"
#include "gradhub/v1/jobs.pb.h"
#include "services/common/contract/defaults.h"
#include "services/common/contract/job_spec.h"

namespace gradhub::trainer {

// Where a rank trains, as the node says (GRADHUB_DEVICE): contract/job_spec.h's RankDevice.
using DeviceKind = RankDevice;

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
  // Where this rank trains (GRADHUB_DEVICE, set by the agent). kCuda: on
  // cuda:<local_rank modulo the GPUs it sees>, which is cuda:0 under the agent: it makes the
  // rank's own GPU the only one visible (CUDA_VISIBLE_DEVICES).
  DeviceKind device = DeviceKind::kCpu;
  // The backend the agent resolved the spec's AUTO to where the rank landed
  // (GRADHUB_BACKEND); AUTO here = NCCL on kCuda, GLOO on kCpu. A spec's explicit NCCL or
  // GLOO wins. NCCL on kCpu is a UserError; GLOO on kCuda trains on the CPU (Gloo reduces CPU
  // tensors).
  v1::DistributedSpec::Backend backend = v1::DistributedSpec::AUTO;
  std::chrono::milliseconds collective_timeout = defaults::kCollectiveTimeout;
  // The address Gloo listens on and its peers connect to (the node's advertised address, set
  // by the agent); "" = GlooOptions' fallbacks (GLOO_SOCKET_IFNAME, the hostname). NCCL reads
  // NCCL_SOCKET_IFNAME itself.
  std::string listen_address;
  // Set (by a SIGTERM handler) when the trainer should stop. Rank 0 then finishes its step,
  // saves, waits up to preempt_grace for the commit and throws Preempted. Other ranks keep
  // training until rank 0 has gone (their next collective fails) or preempt_grace has passed.
  const std::atomic<bool>* stop_requested = nullptr;
  std::chrono::milliseconds preempt_grace = std::chrono::seconds(8);
  // Called on the training thread once, when setup and the resume are done and the first step
  // is about to run. Until then a stop has nothing to save (no step has finished since the
  // checkpoint resumed from), so gradhub-trainer's SIGTERM handler ends the process at once
  // instead of setting stop_requested, which only the loop reads: a rank stopped while it
  // waited for its peers, loaded data or a checkpoint used to sit out the agent's whole stop
  // grace.
  std::function<void()> on_loop_start;
  // Machine-readable progress (one JSON object per line, rank 0 only) and human-readable log.
  std::ostream* progress = nullptr;
  std::ostream* log = nullptr;
  // Tests only: no flag or environment variable sets it. Set, a spec with precision FP16 runs
  // on the CPU too, without autocast (libtorch 1.13's CPU autocast has no float16, so the
  // compute stays float32) but with a loss scaler of these options: the scaling, the skipped
  // steps and the scaler's checkpoint state are then tested where there is no GPU.
  std::optional<ddp::LossScalerOptions> fp16_scaling_on_cpu_for_test;
  // Set, every rank writes its final parameters as text to <dir>/rank-<rank>.txt (rank_model.h
  // DumpParameters): for comparing runs whose ranks hold different parts of the model
  // (pipeline stages against one process) within a tolerance.
  std::string parameters_dump_dir;
  // Where a pipeline's ranks write their stages' states while they move them to and from a
  // checkpoint (files without names, checkpoint_bytes.h: page cache rather than the rank's
  // memory); "" = the current directory (the agent starts a rank in its own directory).
  std::string scratch_dir;
};

struct TrainResult {
  int64_t steps = 0;
  int64_t resumed_from_step = -1;  // -1: started from scratch
  // Rank 0: checkpoints taken, and the training time they cost: the snapshot (the state
  // serialized into host memory) and the wait for a previous upload still running.
  int64_t checkpoints_saved = 0;
  // Periodic ones skipped because the previous upload was still going out.
  int64_t checkpoints_skipped = 0;
  double checkpoint_snapshot_seconds = 0;
  double checkpoint_wait_seconds = 0;
  double final_loss = 0;
  std::map<std::string, double> eval_metrics;  // of the final evaluation
  std::string parameters_sha256;               // of every parameter's bytes, in order
  // precision FP16: optimizer steps skipped because a gradient overflowed (resumed runs
  // included), and the loss scale at the end. 0 otherwise.
  int64_t skipped_steps = 0;
  double loss_scale = 0;
};

// Trains the job on this rank until max_steps / max_epochs, resuming from the newest
// checkpoint when rank 0's sink has one. Throws UserError (spec, data, shapes, a checkpoint
// of another spec, NCCL on a CPU), TrainingFailure (NaN), Preempted, DeviceUnavailable,
// ddp::CommError / ddp::StoreError (peers, rendezvous) and std::runtime_error (I/O, a final
// checkpoint that could not be saved).
TrainResult Train(const v1::JobSpec& spec, const TrainerOptions& options);

}  // namespace gradhub::trainer
