// Datasets as the trainer sees them: indexable samples that turn a list of indices into one
// batch of tensors. Every rank loads the whole dataset and reads only its sampler's shard, so
// loading must be deterministic (same seed, same samples on every rank).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "gpu_worker/common/data_shape.h"
#include "gradhub/v1/jobs.pb.h"

namespace gradhub::data {

class Dataset {
 public:
  virtual ~Dataset() = default;

  virtual int64_t size() const = 0;
  virtual const DataShape& shape() const = 0;

  // The samples at `indices`, stacked: x is [batch, sample_shape...]; y is [batch] class ids
  // (int64) or targets (float32), or [batch, context] next tokens for a language model.
  // Called from the loader's thread while the trainer runs, so it must not mutate.
  virtual void Batch(const std::vector<int64_t>& indices, at::Tensor* x, at::Tensor* y) const = 0;

  // Fits input normalization (when the spec asks for it) on the training split only and
  // applies it to every sample, so validation statistics never leak into training.
  virtual void Normalize(const std::vector<int64_t>& train_indices) {}
};

// Reads or generates the dataset `spec` describes. `context_length` is the transformer's
// (text datasets are windows of context_length + 1 characters). Throws UserError naming the
// spec field, or the file and line, when the data cannot be used.
std::unique_ptr<Dataset> LoadDataset(const v1::DatasetSpec& spec, uint64_t seed,
                                     int64_t context_length);

struct Split {
  std::vector<int64_t> train;
  std::vector<int64_t> validation;
};

// A seeded permutation of [0, n) cut into train and validation (validation_fraction of n,
// rounded down). The same on every rank and every platform.
Split SplitIndices(int64_t n, double validation_fraction, uint64_t seed);

}  // namespace gradhub::data
