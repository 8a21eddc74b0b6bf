// What a checkpoint holds, and the rule for resuming with a spec that changed since it was
// written. Everything exact resume needs: weights and buffers, optimizer state (momentum,
// Adam moments), the step, and the part of the spec that decides the result. Data order and
// random numbers are functions of (seed, rank, step), so no generator state is stored.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "gpu_worker/ddp/mixed_precision.h"
#include "gpu_worker/trainer/checkpoint_bytes.h"
#include "gradhub/v1/jobs.pb.h"

namespace torch {
namespace nn {
class Module;
}
namespace optim {
class Optimizer;
}
}  // namespace torch

namespace gradhub::ddp {
class CommHook;
}

namespace gradhub::trainer {

// What one rank holds that the others do not, saved once per rank: its optimizer shard
// (shardOptimizerState), its replica and optimizer (localSgd: they differ between averages),
// its comm hook's state (PowerSGD's error feedback and warm-start Q; a hook with has_state()),
// saved under the hook's name. Null parts are neither saved nor loaded; save and load must name
// the same parts.
struct RankStateParts {
  torch::nn::Module* module = nullptr;
  torch::optim::Optimizer* optimizer = nullptr;
  ddp::CommHook* comm_hook = nullptr;
  bool empty() const { return !module && !optimizer && !comm_hook; }
};
std::string SerializeRankState(const RankStateParts& parts);
// The same bytes, appended to `file` as torch writes them: a stage's state, which must not be
// copied into memory (checkpoint_bytes.h).
void WriteRankState(const RankStateParts& parts, ScratchFile& file);
// Tensors are read onto `device` (map_location), whatever device they were saved from. Like
// RestoreState, throws UserError ("checkpoint") for bytes that are not an archive gradhub
// writes (checkpoint_archive.h), before torch reads them.
void RestoreRankState(std::string_view bytes, const RankStateParts& parts,
                      const c10::Device& device = c10::kCPU);

// The spec with every field cleared that cannot change the parameters a run ends with, so two
// specs that differ only there resume each other's checkpoints. Harmless: displayName, labels,
// maxSteps and maxEpochs (training longer or shorter; except when a cosine schedule takes its
// period from maxSteps, which is then written in), evalEverySteps, logEverySteps, checkpoint,
// maxRestarts, hangTimeoutSeconds, priority, nodeSelector, distributed.ranksPerNode,
// distributed.collectiveTimeoutSeconds and dataset.prefetchBatches. Everything else (model,
// data, optimizer, schedule, batch, world size, backend, buckets, comm hook and PowerSGD
// settings, local SGD, optimizer sharding, precision, seed) decides the result.
v1::JobSpec ResumeRelevantSpec(const v1::JobSpec& spec_with_defaults);

// What the update rule (update_rule.h) holds alike on every rank, saved once. Null parts are
// neither saved nor loaded.
struct SharedUpdateState {
  // Null with ZeRO: each rank's shard is in its rank state only.
  torch::optim::Optimizer* optimizer = nullptr;
  // precision FP16: the same state on every rank (every rank skips the same steps).
  ddp::LossScaler* loss_scaler = nullptr;
};

// The archive's bytes (torch's zip format), a copy in host memory that training may run on
// from while it is uploaded. Tensors on a GPU are copied out as they are written (the archive
// records their device; RestoreState maps them to the device it is given, so a checkpoint
// saved on a GPU loads on a CPU-only node and back). `rank_states`: SerializeRankState of
// every rank, in rank order, or empty. `memory`: a string whose memory the archive is written
// into (its contents are dropped), e.g. the previous checkpoint's (CheckpointBytes::Reclaim).
std::string SerializeState(torch::nn::Module& module, const SharedUpdateState& update, int64_t step,
                           const v1::JobSpec& spec_with_defaults,
                           const std::vector<std::string>& rank_states = {},
                           std::string memory = {});

// Loads the state into `module` and `update`'s parts, every tensor read onto `device` (the
// module's: torch's map_location), and returns its step; with `rank_state`, sets it to rank
// `rank`'s saved rank state (empty when the checkpoint has none). A loss scaler is left as it
// is (its initial state) when the checkpoint has none (one from before FP16). Throws
// UserError ("checkpoint") for bytes that are not an archive gradhub writes, checked before
// torch reads them (checkpoint_archive.h), or that would give a parameter, buffer or optimizer
// state another shape, type or device than the model's; and UserError ("spec") naming the changed
// fields when the checkpoint was written under a spec whose ResumeRelevantSpec differs.
int64_t RestoreState(const std::string& bytes, torch::nn::Module& module,
                     const SharedUpdateState& update, const v1::JobSpec& spec_with_defaults,
                     int rank = 0, std::string* rank_state = nullptr,
                     const c10::Device& device = c10::kCPU);

// Throws UserError ("spec") naming the changed fields when `saved_spec` (a checkpoint's, the
// serialized ResumeRelevantSpec it was written under) differs from ResumeRelevantSpec(spec).
void RequireSameSpec(const std::string& saved_spec, const v1::JobSpec& spec_with_defaults);

// A pipeline's checkpoint (parallelism.pipelineStages > 1): every stage's state under one
// step, as pipeline_checkpoint_format.h lays it out (the Checkpointer writes it stage by
// stage), or as a torch archive when written before that layout.
struct PipelineState {
  int64_t step = 0;
  std::string spec;                 // the serialized ResumeRelevantSpec it was written under
  std::vector<double> layer_costs;  // empty in a checkpoint written before they were recorded
  // Of every stage the checkpoint has, in stage order (a data-parallel checkpoint has none:
  // its spec differs in parallelism, which RequireSameSpec reports). Slices of the bytes read,
  // sharing their storage.
  std::vector<CheckpointBytes> stage_states;
};
// Throws UserError ("checkpoint") for bytes that are neither layout.
PipelineState ReadPipelineState(const CheckpointBytes& bytes);
// Only the layer costs of a pipeline's checkpoint (PipelineState::layer_costs): what a resumed
// rank 0 needs before its model is built. Throws as ReadPipelineState.
std::vector<double> ReadPipelineLayerCosts(const CheckpointBytes& bytes);

}  // namespace gradhub::trainer
