#include <ATen/ATen.h>
#include <zlib.h>

#include <cerrno>
#include <cstring>

#include "gpu_worker/data/sampler.h"
#include "gpu_worker/data/tensor_dataset.h"
#include "services/common/contract/input_file.h"
#include "services/common/contract/user_error.h"

namespace gradhub::data {

// Opened under the node's input policy (input_file.h: data roots, regular files, size cap);
// gzip or plain (zlib reads plain files as they are). The cap bounds the decompressed bytes
// too, so a small gzip bomb cannot fill the rank's memory.
std::string ReadFileContents(const std::string& path, const std::string& field) {
  const InputPolicy& policy = CurrentInputPolicy();
  InputFile input = OpenInputFile(path, field, policy);
  gzFile file = gzdopen(input.Release(), "rb");
  if (file == nullptr) throw UserError(field, "cannot open " + path + ": out of memory");
  std::string contents;
  char buffer[1 << 16];
  int read;
  while ((read = gzread(file, buffer, sizeof buffer)) > 0) {
    if (static_cast<int64_t>(contents.size()) + read > policy.max_bytes) {
      gzclose(file);
      throw UserError(field, path + " holds more than this node accepts (" +
                                 std::to_string(policy.max_bytes) +
                                 " bytes after decompression, gradhub-agent --max-input-bytes)");
    }
    contents.append(buffer, read);
  }
  int code = Z_OK;
  const std::string error = read < 0 ? gzerror(file, &code) : "";
  gzclose(file);
  if (read < 0) {
    throw UserError(
        field, "cannot read " + path + ": " + (code == Z_ERRNO ? std::strerror(errno) : error));
  }
  return contents;
}

TensorDataset::TensorDataset(at::Tensor inputs, at::Tensor targets, DataShape shape,
                             Normalization normalization)
    : inputs_(std::move(inputs)),
      targets_(std::move(targets)),
      shape_(std::move(shape)),
      normalization_(normalization) {}

void TensorDataset::Batch(const std::vector<int64_t>& indices, at::Tensor* x, at::Tensor* y) const {
  const at::Tensor index = at::from_blob(const_cast<int64_t*>(indices.data()),
                                         {static_cast<int64_t>(indices.size())}, at::kLong);
  *x = inputs_.index_select(0, index);
  *y = targets_.index_select(0, index);
}

void TensorDataset::Normalize(const std::vector<int64_t>& train_indices) {
  if (normalization_ == Normalization::kNone || train_indices.empty()) return;
  const at::Tensor index = at::tensor(train_indices, at::kLong);
  const at::Tensor train = inputs_.index_select(0, index);
  at::Tensor shift, scale;
  if (normalization_ == Normalization::kStandard) {
    shift = train.mean(0);
    scale = train.std(0, /*unbiased=*/false);
  } else {
    shift = std::get<0>(train.min(0));
    scale = std::get<0>(train.max(0)) - shift;
  }
  // A constant feature carries no information; leave it centered instead of dividing by 0.
  scale = at::where(scale > 0, scale, at::ones_like(scale));
  inputs_ = (inputs_ - shift) / scale;
  normalization_ = Normalization::kNone;  // idempotent: a second call changes nothing
}

TextWindows::TextWindows(at::Tensor tokens, int64_t context_length, int64_t vocab_size)
    : tokens_(std::move(tokens)),
      context_length_(context_length),
      windows_((tokens_.numel() - 1) / context_length) {
  shape_.task = Task::kLanguageModel;
  shape_.sample_shape = {context_length};
  shape_.vocab_size = vocab_size;
}

void TextWindows::Batch(const std::vector<int64_t>& indices, at::Tensor* x, at::Tensor* y) const {
  std::vector<at::Tensor> windows;
  windows.reserve(indices.size());
  for (int64_t i : indices)
    windows.push_back(tokens_.narrow(0, i * context_length_, context_length_ + 1));
  const at::Tensor stacked = at::stack(windows);
  *x = stacked.narrow(1, 0, context_length_).contiguous();
  *y = stacked.narrow(1, 1, context_length_).contiguous();
}

std::unique_ptr<Dataset> LoadDataset(const v1::DatasetSpec& spec, uint64_t seed,
                                     int64_t context_length) {
  std::unique_ptr<Dataset> dataset;
  switch (spec.kind_case()) {
    case v1::DatasetSpec::kSynthetic:
      dataset = MakeSynthetic(spec.synthetic(), seed);
      break;
    case v1::DatasetSpec::kCsv:
      dataset = ReadCsv(spec.csv());
      break;
    case v1::DatasetSpec::kIdx:
      dataset = ReadIdx(spec.idx());
      break;
    case v1::DatasetSpec::kText:
      if (context_length <= 0) {
        throw UserError("model", "a text dataset trains the transformer model only");
      }
      dataset = ReadText(spec.text(), context_length);
      break;
    case v1::DatasetSpec::KIND_NOT_SET:
      throw UserError("dataset", "is not set (synthetic, csv, idx or text)");
  }
  if (dataset->size() < 1) throw UserError("dataset", "has no samples");
  return dataset;
}

Split SplitIndices(int64_t n, double validation_fraction, uint64_t seed) {
  std::vector<int64_t> order(n);
  for (int64_t i = 0; i < n; ++i) order[i] = i;
  // Its own stream, so the split does not move when sampler seeds change.
  SeededShuffle(order, seed ^ 0x5eedf00dULL);
  const int64_t validation = static_cast<int64_t>(validation_fraction * n);
  Split split;
  split.validation.assign(order.begin(), order.begin() + validation);
  split.train.assign(order.begin() + validation, order.end());
  return split;
}

}  // namespace gradhub::data
