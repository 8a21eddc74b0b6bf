// Fuzzes the CSV dataset reader (gpu_worker/data/csv.cc) with the file a job's spec names: the
// trainer's LoadDataset reads it (plain or gzip), splits the samples, fits the normalization on
// the training split and batches samples, as a rank does before its first step.
// An input is the file's bytes; when its first line is a JSON object, that line is the spec's
// dataset.csv (header, label column, delimiter, task, normalize; proto3 JSON) and the rest is
// the file. A spec the api would refuse (ValidateJobSpec) is skipped. The node's input cap
// (gradhub-agent --max-input-bytes) is 1 MiB here, so a gzip input stays fast.
// Checked besides "never crashes" (ASan, UBSan on the reader):
//   1. bad data ends in UserError (named, shown to the job's owner), never another exception;
//   2. what is read is trainable: every input finite after normalization (no inf or NaN in a
//      first step), classification labels in [0, num_classes), regression targets finite.
#include <google/protobuf/util/json_util.h>
#include <unistd.h>

#include <ATen/ATen.h>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <numeric>
#include <string>
#include <string_view>
#include <vector>

#include "gpu_worker/data/dataset.h"
#include "services/common/contract/input_file.h"
#include "services/common/contract/job_spec.h"
#include "services/common/contract/user_error.h"

namespace {

namespace fs = std::filesystem;
namespace v1 = gradhub::v1;

constexpr int64_t kMaxInputBytes = 1 << 20;
constexpr double kValidationFraction = 0.25;

void Require(bool condition) {
  if (!condition) std::abort();
}

// The scratch directory of this process, made once and removed at exit.
const fs::path& Scratch() {
  static const fs::path dir = [] {
    std::string pattern = (fs::temp_directory_path() / "gradhub-fuzz-csv-XXXXXX").string();
    Require(mkdtemp(pattern.data()) != nullptr);
    std::atexit([] { fs::remove_all(Scratch()); });
    gradhub::InputPolicy policy;
    policy.max_bytes = kMaxInputBytes;
    gradhub::SetInputPolicy(policy);
    return fs::path(pattern);
  }();
  return dir;
}

// A spec the api accepts, whose dataset the input replaces.
v1::JobSpec BaseSpec() {
  static const v1::JobSpec spec = gradhub::ParseJobSpec(
      "model: {mlp: {layers: [4, 8, 3]}}\n"
      "dataset: {csv: {path: /data/in.csv}}\n"
      "optimizer: {sgd: {lr: 0.1}}\n"
      "batchSizePerRank: 8\n"
      "maxSteps: 10\n");
  return spec;
}

// The spec's dataset.csv (from the input's first line, when it is a JSON object) and the file.
// False when the first line is a spec the api would refuse.
bool SplitInput(std::string_view input, v1::DatasetSpec* dataset, std::string_view* file) {
  *file = input;
  if (input.empty() || input.front() != '{') return true;
  const size_t end = input.find('\n');
  const std::string line(input.substr(0, end));
  if (!google::protobuf::util::JsonStringToMessage(line, dataset->mutable_csv()).ok()) return true;
  *file = end == std::string_view::npos ? std::string_view() : input.substr(end + 1);
  v1::JobSpec spec = BaseSpec();
  dataset->mutable_csv()->set_path(spec.dataset().csv().path());
  *spec.mutable_dataset() = *dataset;
  return gradhub::ValidateJobSpec(spec).empty();
}

// Check 2 on every sample, after the trainer's split and normalization.
void RequireTrainable(gradhub::data::Dataset& dataset) {
  const gradhub::data::Split split =
      gradhub::data::SplitIndices(dataset.size(), kValidationFraction, 1);
  dataset.Normalize(split.train);
  std::vector<int64_t> all(static_cast<size_t>(dataset.size()));
  std::iota(all.begin(), all.end(), 0);
  at::Tensor x, y;
  dataset.Batch(all, &x, &y);
  Require(x.isfinite().all().item<bool>());
  const gradhub::DataShape& shape = dataset.shape();
  if (shape.task == gradhub::Task::kClassification) {
    Require(shape.num_classes >= 1 && y.min().item<int64_t>() >= 0 &&
            y.max().item<int64_t>() < shape.num_classes);
  } else {
    Require(y.isfinite().all().item<bool>());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  v1::DatasetSpec dataset;
  std::string_view file;
  if (!SplitInput(std::string_view(reinterpret_cast<const char*>(data), size), &dataset, &file)) {
    return 0;
  }
  const fs::path path = Scratch() / "in.csv";
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(file.data(), static_cast<std::streamsize>(file.size()));
    Require(out.good());
  }
  dataset.mutable_csv()->set_path(path.string());
  std::unique_ptr<gradhub::data::Dataset> loaded;
  try {
    loaded = gradhub::data::LoadDataset(dataset, /*seed=*/1, /*context_length=*/0);
  } catch (const gradhub::UserError&) {
    return 0;  // check 1: any other exception escapes, a crash
  }
  RequireTrainable(*loaded);
  return 0;
}
