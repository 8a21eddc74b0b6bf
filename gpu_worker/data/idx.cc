#include <ATen/ATen.h>

#include "gpu_worker/data/tensor_dataset.h"
#include "services/common/contract/user_error.h"

namespace gradhub::data {
namespace {

// An IDX file of unsigned bytes: magic 0x00 0x00 0x08 <dims>, big-endian sizes, then data.
struct IdxArray {
  std::vector<int64_t> dims;
  std::string bytes;  // the whole file; data starts at `offset`
  size_t offset = 0;
};

IdxArray ReadIdxArray(const std::string& path, const std::string& field) {
  IdxArray array;
  array.bytes = ReadFileContents(path, field);
  const auto& b = array.bytes;
  if (b.size() < 4 || b[0] != 0 || b[1] != 0) {
    throw UserError(field, path + " is not an IDX file (bad magic number)");
  }
  if (static_cast<unsigned char>(b[2]) != 0x08) {
    throw UserError(field, path + " holds IDX type 0x" +
                               std::to_string(static_cast<unsigned char>(b[2])) +
                               "; only unsigned bytes (0x08) are supported");
  }
  const int rank = static_cast<unsigned char>(b[3]);
  array.offset = 4 + 4 * static_cast<size_t>(rank);
  if (rank == 0 || b.size() < array.offset)
    throw UserError(field, path + " has a truncated header");
  int64_t elements = 1;
  for (int i = 0; i < rank; ++i) {
    int64_t dim = 0;
    for (int j = 0; j < 4; ++j) dim = (dim << 8) | static_cast<unsigned char>(b[4 + 4 * i + j]);
    array.dims.push_back(dim);
    elements *= dim;
  }
  if (static_cast<int64_t>(b.size() - array.offset) != elements) {
    throw UserError(field, path + " has " + std::to_string(b.size() - array.offset) +
                               " data bytes; its header " + ShapeString(array.dims) + " says " +
                               std::to_string(elements));
  }
  return array;
}

at::Tensor BytesTensor(IdxArray& array) {
  std::vector<int64_t> sizes = array.dims;
  return at::from_blob(array.bytes.data() + array.offset, sizes, at::kByte).clone();
}

}  // namespace

std::unique_ptr<TensorDataset> ReadIdx(const v1::IdxDataset& spec) {
  IdxArray images = ReadIdxArray(spec.images_path(), "dataset.idx.imagesPath");
  IdxArray labels = ReadIdxArray(spec.labels_path(), "dataset.idx.labelsPath");
  if (images.dims.size() != 3) {
    throw UserError("dataset.idx.imagesPath", spec.images_path() + " has shape " +
                                                  ShapeString(images.dims) +
                                                  "; images are [count, rows, columns]");
  }
  if (labels.dims.size() != 1) {
    throw UserError(
        "dataset.idx.labelsPath",
        spec.labels_path() + " has shape " + ShapeString(labels.dims) + "; labels are [count]");
  }
  if (images.dims[0] != labels.dims[0]) {
    throw UserError("dataset.idx", spec.images_path() + " has " + std::to_string(images.dims[0]) +
                                       " images but " + spec.labels_path() + " has " +
                                       std::to_string(labels.dims[0]) + " labels");
  }
  at::Tensor inputs = BytesTensor(images).to(at::kFloat).unsqueeze(1);  // one channel
  if (spec.normalize()) inputs = inputs / 255.0;
  at::Tensor targets = BytesTensor(labels).to(at::kLong);
  DataShape shape;
  shape.task = Task::kClassification;
  shape.sample_shape = {1, images.dims[1], images.dims[2]};
  shape.num_classes = targets.numel() > 0 ? targets.max().item<int64_t>() + 1 : 0;
  return std::make_unique<TensorDataset>(std::move(inputs), std::move(targets), std::move(shape));
}

}  // namespace gradhub::data
