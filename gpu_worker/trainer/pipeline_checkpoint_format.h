// A pipeline's checkpoint (parallelism.pipelineStages > 1): every stage's state under one
// step, laid end to end after an index, so that rank 0 writes it stage by stage as the states
// arrive from their ranks, and reads each stage's part in place (a slice of a mapped file),
// without ever holding a stage's state in memory (checkpoint_bytes.h says why).
//
// Layout (integers little-endian, unsigned unless said):
//   magic        "GHPIPE01", 8 bytes
//   index_size   u64: the bytes of the index
//   index        step (i64); spec_size (u64), spec (the serialized ResumeRelevantSpec it was
//                written under); cost_count (u64), layer costs (f64 each: what the split
//                balanced, rank_model.h step 2, so that a resume splits alike even when the
//                costs were measured times); stage_count (u64), each stage's size (u64)
//   stages       each stage's state (SerializeRankState of its module and optimizer, from the
//                stage's replica 0: the replicas hold the same), in stage order, and nothing
//                after them
// Checkpoints written before this layout are a torch archive of the same fields
// (checkpoint_state.h reads both).
//
// No torch: the index is read before torch sees any of the bytes, whose stages
// RestoreRankState checks (checkpoint_archive.h) as it reads them. Thread-safe: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "gpu_worker/trainer/checkpoint_bytes.h"

namespace gradhub::trainer {

inline constexpr std::string_view kPipelineCheckpointMagic = "GHPIPE01";

// The magic, index_size and index: what goes before the stages' states, whose sizes it takes.
std::string PipelineCheckpointIndex(int64_t step, std::string_view spec,
                                    const std::vector<double>& layer_costs,
                                    const std::vector<int64_t>& stage_sizes);

// Whether `bytes` begin with the magic (else they are an older archive, or not a pipeline's).
bool IsPipelineCheckpoint(std::string_view bytes);

struct PipelineCheckpoint {
  int64_t step = 0;
  std::string spec;
  std::vector<double> layer_costs;
  std::vector<CheckpointBytes> stage_states;  // slices of the bytes read, sharing their storage
};
// Throws UserError("checkpoint", why) for bytes that do not have the layout above (a short or
// oversized field, stage sizes that do not add up to the rest).
PipelineCheckpoint ReadPipelineCheckpoint(const CheckpointBytes& bytes);

}  // namespace gradhub::trainer
