// How a model splits into pipeline stages, without torch: a stage is a contiguous range of the
// model's layers (models/model.h builds one), and PartitionLayers chooses the ranges from
// per-layer costs. The zoo's layer counts follow from the spec alone, so the API can check
// `parallelism.pipelineStages` against them at submission (a TorchScript model's count is
// known only once a node loads it: LayerCount in model.h).
//
// Thread-compatible: plain functions of their arguments.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "gradhub/v1/jobs.pb.h"

namespace gradhub::models {

// Layers [first_layer, end_layer) of a model, in the model's order.
struct StageRange {
  int64_t first_layer = 0;
  int64_t end_layer = 0;  // one past the last

  int64_t size() const { return end_layer - first_layer; }
  bool operator==(const StageRange& other) const {
    return first_layer == other.first_layer && end_layer == other.end_layer;
  }
};

// The layers of each zoo architecture, in order (what a stage holds a contiguous range of):
//   mlp          one per Linear (its activation and dropout after it; the first flattens)
//   cnn          one per conv unit (conv, ReLU, pool), the hidden Linear, the output Linear
//   resnet       the stem (conv, BN, ReLU), one per residual block, the head (pool, Linear)
//   transformer  the embedding (tokens + positions), one per block, the final norm + head
// nullopt for a TorchScript model (its top-level children, counted once loaded) or no model.
// For a spec the zoo refuses (an MLP of fewer than 2 widths) the count is meaningless.
std::optional<int64_t> ZooLayerCount(const v1::ModelSpec& spec);

// The spec's lists with their documented defaults applied (jobs.proto).
std::vector<int64_t> CnnChannels(const v1::CnnModel& spec);      // empty = [6, 16]
std::vector<int64_t> ResNetBlocks(const v1::ResNetModel& spec);  // empty = [3, 3, 3]

// Splits layers with these costs into `stages` contiguous non-empty ranges, in order, so that
// the costliest stage costs as little as possible (the linear partition problem).
//   1. The optimum B is the smallest cost of a contiguous range of layers such that the
//      layers fit `stages` ranges of at most B each. Range costs are summed from the range's
//      first layer forward, in the same way step 2 sums them, so B is exact in floating point.
//   2. Ties, deterministically: each stage, first to last, takes as many layers as keep it
//      within B while leaving one layer for each later stage.
// Costs are parameter counts (LayerParameterCounts) or measured seconds (MeasureLayerSeconds:
// every rank must partition the same costs, so measure on one rank and broadcast them).
// Throws std::invalid_argument naming `pipelineStages` when stages < 1 or stages exceeds the
// layers, and naming the costs when one is negative or not finite.
std::vector<StageRange> PartitionLayers(const std::vector<double>& costs, int64_t stages);

}  // namespace gradhub::models
