// The in-memory datasets behind LoadDataset; internal to gpu_worker/data.
#pragma once

#include <string>

#include "gpu_worker/data/dataset.h"

namespace gradhub::data {

enum class Normalization { kNone, kStandard, kMinMax };

// Samples held as one tensor of inputs and one of targets (CSV, IDX, synthetic).
class TensorDataset : public Dataset {
 public:
  TensorDataset(at::Tensor inputs, at::Tensor targets, DataShape shape,
                Normalization normalization = Normalization::kNone);

  int64_t size() const override { return inputs_.size(0); }
  const DataShape& shape() const override { return shape_; }
  void Batch(const std::vector<int64_t>& indices, at::Tensor* x, at::Tensor* y) const override;
  void Normalize(const std::vector<int64_t>& train_indices) override;

 private:
  at::Tensor inputs_;   // float32 [n, sample_shape...]
  at::Tensor targets_;  // int64 or float32 [n]
  DataShape shape_;
  Normalization normalization_;
};

// A character corpus cut into consecutive windows: sample i is the context_length + 1 bytes
// starting at i * context_length; x is the first context_length, y the same shifted by one.
class TextWindows : public Dataset {
 public:
  TextWindows(at::Tensor tokens, int64_t context_length, int64_t vocab_size);

  int64_t size() const override { return windows_; }
  const DataShape& shape() const override { return shape_; }
  void Batch(const std::vector<int64_t>& indices, at::Tensor* x, at::Tensor* y) const override;

 private:
  at::Tensor tokens_;  // int64 [length]
  int64_t context_length_;
  int64_t windows_;
  DataShape shape_;
};

std::unique_ptr<TensorDataset> ReadCsv(const v1::CsvDataset& spec);
std::unique_ptr<TensorDataset> ReadIdx(const v1::IdxDataset& spec);
std::unique_ptr<TensorDataset> MakeSynthetic(const v1::SyntheticDataset& spec, uint64_t seed);
std::unique_ptr<TextWindows> ReadText(const v1::TextDataset& spec, int64_t context_length);

// The whole file, decompressed when it is gzip (zlib reads plain files unchanged).
// `field` names the spec field holding the path, for the error.
std::string ReadFileContents(const std::string& path, const std::string& field);

}  // namespace gradhub::data
