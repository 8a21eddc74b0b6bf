// Measured per-layer costs for PartitionLayers (stages.h), the alternative to parameter
// counts when layers of equal size differ in compute (convolutions on large images against a
// classifier head, attention against embeddings).
//
// Timings differ between runs and between ranks, and every rank must build the same stages:
// measure on one rank, broadcast the vector to the others (ProcessGroup::Broadcast of a
// float64 tensor), then partition it on every rank.
//
// Not thread-safe against other users of torch's generators: dropout in the measured layers
// draws from them (the default CPU generator's state is restored afterwards).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "gpu_worker/common/data_shape.h"
#include "gradhub/v1/jobs.pb.h"

namespace gradhub::models {

// Forward plus backward seconds of each layer of the model (LayerCount entries), each the
// median of `repeats` runs after one warm-up, in training mode, on `sample`'s device:
//   1. Layer i alone is built (BuildModelStage {i, i + 1}) and moved to the device; peak
//      memory is one layer's weights and activations.
//   2. Its input is the previous layer's output on the sample (the first layer's: `sample`, a
//      batch as the trainer gives the model), with requires_grad when floating point, so the
//      backward computes the input gradient a pipeline stage sends back.
//   3. Timed: forward, then backward of the output's sum; on CUDA, synchronized before and
//      after.
// Throws std::invalid_argument when repeats < 1.
std::vector<double> MeasureLayerSeconds(const v1::ModelSpec& spec, const DataShape& data,
                                        const at::Tensor& sample, uint64_t seed, int repeats = 3);

}  // namespace gradhub::models
