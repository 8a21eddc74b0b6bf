// A rank's side of checkpoints: resuming from the newest, and saving at the plan's cadence.
// Rank 0 alone talks to the store (its CheckpointSink); the other ranks take part in the
// transfers that move the state.
//
// Resume, on every rank (Load, then the rank state once the gradient sync exists):
//   1. When saving is a collective (per-rank state, pipeline stages), rank 0 tells every rank
//      whether it saves at all (a broadcast): every rank must then take part in each save.
//   2. Rank 0 reads the newest checkpoint (one download, one hash check, through its
//      LatestCheckpoint, which may have fetched it already) and broadcasts its
//      bytes: every rank needs the optimizer state, and all then start from the same bytes
//      even if they would have raced a commit. With pipeline stages it broadcasts only the
//      step and the spec the checkpoint was written under (every rank refuses a changed spec
//      alike), then streams each rank its own stage's state, point to point, from the mapped
//      checkpoint into a scratch file the rank maps (checkpoint_bytes.h: no rank holds a copy
//      of a stage's state in memory, only the state it restores).
//   3. Every rank restores the model and the update rule's shared state from them (a
//      pipeline's rank: its stage's), and keeps its own rank state for
//      UpdateRule::RestoreRankState.
// Save, at the plan's steps:
//   1. With per-rank state every rank serializes its own and rank 0 gathers them (a
//      collective: every rank calls Save at the same steps). With pipeline stages, each
//      stage's replica-0 rank (global rank = its stage) other than rank 0 writes its module
//      and optimizer to a scratch file and streams it to rank 0, which writes one checkpoint
//      file of every stage (pipeline_checkpoint_format.h), its own stage straight into it and
//      the others' as their chunks arrive: GatherStages.
//   2. Rank 0 snapshots the state into host memory (a pipeline's: into that file, mapped) and
//      hands it to the AsyncCheckpointWriter, which uploads on its own thread. A periodic
//      checkpoint that comes due while the previous upload is still running is skipped
//      (async_checkpoint_writer.h, step 1), decided before step 1 so that rank 0 serializes
//      nothing for it; when saving is a collective the other ranks, who do not know, still
//      take part and rank 0 drops what they send. The final checkpoint and a preemption's wait
//      for the upload in flight; that wait and the snapshot are the stall a checkpoint costs.
//      Rank 0 keeps the memory of its last snapshot in host memory (not a pipeline's file) and
//      writes the next one into it once the upload has let go of it: the pages are there
//      already, where a fresh buffer took a page fault per 4 KiB on the training thread (55 ms
//      of a 160 MiB state's 156 ms snapshot, perf). That memory is in use during every upload
//      anyway, so the rank's peak is the same; it stays resident between checkpoints.
// Not thread-safe: the training thread drives it.
#pragma once

#include <torch/nn/module.h>

#include <chrono>
#include <cstdint>
#include <iosfwd>
#include <memory>
#include <optional>
#include <string>

#include "gpu_worker/ddp/comm/process_group.h"
#include "gpu_worker/trainer/async_checkpoint_writer.h"
#include "gpu_worker/trainer/checkpoint_state.h"
#include "gpu_worker/trainer/progress_reporter.h"
#include "gpu_worker/trainer/rank_model.h"
#include "gpu_worker/trainer/sinks.h"
#include "gpu_worker/trainer/training_plan.h"
#include "gpu_worker/trainer/update_rule.h"

namespace gradhub::trainer {

// Rank 0's newest checkpoint, downloaded at most once. A pipeline split by measured times
// reads the costs its split balanced (PipelineState::layer_costs) before the model is built,
// so that a restart splits as the checkpoint's run did (a new measurement could move a layer
// to another stage, and the stages' states would not fit); the Checkpointer then resumes from
// the same bytes.
class LatestCheckpoint {
 public:
  // `sink`: rank 0's store, or null (other ranks, or no store): then there is none.
  explicit LatestCheckpoint(std::shared_ptr<CheckpointSink> sink) : sink_(std::move(sink)) {}
  // The bytes, downloaded on the first call; nullopt when there is no checkpoint.
  const std::optional<CheckpointBytes>& Peek();
  // The bytes, handed over: later calls return nullopt.
  std::optional<CheckpointBytes> Take();

 private:
  const std::shared_ptr<CheckpointSink> sink_;
  bool fetched_ = false;
  std::optional<CheckpointBytes> bytes_;
};

// The layer costs a pipeline's newest checkpoint recorded, on rank 0 when the plan splits by
// measured time (else, and on the other ranks, empty: BuildRankModel measures).
std::vector<double> RecordedLayerCosts(const TrainingPlan& plan, LatestCheckpoint& latest);

// Why a checkpoint is saved, which decides what it does while an upload is in flight.
enum class SaveReason {
  kPeriodic,  // checkpoint.everySteps: skipped while the previous upload is in flight
  kFinal,     // the last step: waits for it
  kStop,      // a stop request: waits for it. When saving is a collective rank 0 then saves
              // nothing (the other ranks would not take part).
};

// What Save did on this rank.
struct SaveReport {
  // Rank 0 handed the checkpoint to the writer: the seconds the training loop spent on it.
  std::optional<double> seconds;
  // Rank 0 skipped it: the upload it found in flight.
  std::optional<InFlightSave> skipped;
};

class Checkpointer {
 public:
  // `sink`: rank 0's store, or null (other ranks, or no store); `latest`: what resume reads
  // (rank 0's, over the same sink), which must outlive this. `model` and `rule`: what a
  // checkpoint holds, with the plan's spec. `scratch_dir`: where a pipeline's stage states
  // are written on their way (TrainerOptions::scratch_dir).
  Checkpointer(const TrainingPlan& plan, std::shared_ptr<CheckpointSink> sink,
               LatestCheckpoint& latest, std::ostream& log,
               std::shared_ptr<ddp::ProcessGroup> group, const c10::Device& device,
               const RankModel& model, UpdateRule& rule, std::string scratch_dir = "");

  struct Resumed {
    int64_t step = 0;
    std::string rank_state;  // this rank's (UpdateRule::RestoreRankState), or empty
  };
  // Resume steps 1-3; nullopt when rank 0 has no checkpoint.
  std::optional<Resumed> Load();
  int64_t resumed_from_step() const { return resumed_from_step_; }  // -1: from scratch

  // Save steps 1-2 for the state after `step` steps; an empty report on another rank, without
  // a store, or when `step` was saved (or skipped) already.
  SaveReport Save(int64_t step, SaveReason reason);
  // Rank 0: the newest step handed to the writer, or resumed from; -1 before any.
  int64_t last_saved_step() const;

  // Waits for the save in flight; a save that failed or did not end in time throws
  // std::runtime_error, so the attempt ends as an infrastructure failure and restarts from
  // the previous checkpoint. No-op without a store.
  void Flush(std::chrono::milliseconds timeout);
  bool has_store() const { return writer_ != nullptr; }
  const CheckpointTotals& totals() const { return totals_; }

 private:
  std::optional<Resumed> LoadReplicated();  // resume steps 2-3, every rank alike
  std::optional<Resumed> LoadStages();      // with pipeline stages
  RankStateParts StageParts();              // a pipeline rank's: its module and optimizer
  CheckpointBytes WriteStageState();        // StageParts in a mapped scratch file
  CheckpointBytes ReceiveStageState();      // a stage's state streamed from rank 0, likewise
  // Save step 1: the bytes rank 0 writes (nullopt on the others). With `keep` false (a
  // skipped checkpoint whose save is a collective) rank 0 takes part and serializes nothing of
  // its own, except with pipeline stages: it writes the file as the stages arrive, then drops
  // it.
  std::optional<CheckpointBytes> Snapshot(int64_t step, bool keep);
  std::optional<CheckpointBytes> GatherStages(int64_t step);

  const TrainingPlan& plan_;
  const std::shared_ptr<CheckpointSink> sink_;
  LatestCheckpoint& latest_;
  const std::unique_ptr<AsyncCheckpointWriter> writer_;  // rank 0 with a store
  const std::shared_ptr<ddp::ProcessGroup> group_;
  const c10::Device device_;
  torch::nn::Module& module_;
  const std::vector<double> layer_costs_;  // a pipeline's split (RankModel::layer_costs)
  UpdateRule& rule_;
  const std::string scratch_dir_;
  bool rank0_saves_ = false;  // known on every rank when saving is a collective (resume step 1)
  // The last step saved, skipped or resumed from: on every rank alike when saving is a
  // collective (so that all take part in the same saves), else rank 0's.
  int64_t last_step_ = -1;
  int64_t resumed_from_step_ = -1;
  CheckpointTotals totals_;
  CheckpointBytes previous_snapshot_;  // rank 0's last in memory, shared with the writer
};

}  // namespace gradhub::trainer
