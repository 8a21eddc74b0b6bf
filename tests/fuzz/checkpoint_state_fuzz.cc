// Fuzzes the checkpoint loader (gpu_worker/trainer/checkpoint_state.h) with the bytes a
// resuming trainer gets from the checkpoint store: RestoreState into a model, its optimizer
// and loss scaler, then RestoreRankState with the rank state it returned, as the trainer does
// (checkpointer.cc, trainer.cc). The bytes are hostile: a script job's ranks upload their own.
// An input is either
//   - an archive as stored (it starts "PK", a zip): bytes as they come, so the zip reader's
//     checks are fuzzed; or
//   - a pipeline's checkpoint (it starts with pipeline_checkpoint_format.h's magic): its index
//     is read, and each stage's state restored as a pipeline's rank restores its own; or
//   - the records of one: repeated [name length: 1 byte][name][size: 4 bytes, little endian]
//     [content], which this target zips with torch's own writer (a size past the end takes
//     the rest). The zip is then valid (sizes, CRCs), so mutations reach what reads the
//     records: the pickles, the TorchScript code of the archive's classes, the tensors' data.
// Checked besides "never crashes" (ASan and UBSan on gradhub's code; libtorch is not
// instrumented, so its faults show as signals):
//   1. a bad checkpoint ends in an exception (the trainer exits with a job error), nothing else;
//   2. a checkpoint that loads leaves every parameter and buffer of the model, and every
//      optimizer state tensor, with its shape, dtype and device, its data inside its storage:
//      the next step runs on memory the model owns.
// GRADHUB_FUZZ_WRITE_SEEDS=<dir> writes the seed corpus (valid checkpoints of this target's
// model and their records) into <dir> and exits: corpus/checkpoint_state/ came from it.
#include <c10/util/Logging.h>
#include <caffe2/serialize/inline_container.h>
#include <torch/torch.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "gpu_worker/trainer/checkpoint_archive.h"
#include "gpu_worker/trainer/checkpoint_state.h"
#include "gpu_worker/trainer/pipeline_checkpoint_format.h"
#include "services/common/contract/job_spec.h"
#include "services/common/contract/user_error.h"

namespace {

namespace fs = std::filesystem;
namespace trainer = gradhub::trainer;
namespace v1 = gradhub::v1;

void Require(bool condition) {
  if (!condition) std::abort();
}

const v1::JobSpec& Spec() {
  static const v1::JobSpec spec = gradhub::WithDefaults(gradhub::ParseJobSpec(
      "model: {mlp: {layers: [4, 3]}}\n"
      "dataset: {synthetic: {numSamples: 64, numFeatures: 4, numClasses: 3}}\n"
      "optimizer: {sgd: {lr: 0.1, momentum: 0.9}}\n"
      "batchSizePerRank: 8\n"
      "maxSteps: 10\n"));
  return spec;
}

// What a rank restores: a model with parameters and buffers, an optimizer with state. Made
// fresh per input (a load may have replaced any of it). No loss scaler: its reader is three
// scalar reads (RestoreState's ReadLossScaler), and it would take the DDP engine's library.
struct RankState {
  torch::nn::Sequential model{torch::nn::Linear(4, 3), torch::nn::BatchNorm1d(3)};
  torch::optim::SGD optimizer{model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9)};

  RankState() {  // one step, so the optimizer has momentum buffers to save and load
    model->train();
    optimizer.zero_grad();
    model->forward(torch::ones({2, 4})).sum().backward();
    optimizer.step();
  }
  trainer::SharedUpdateState shared() { return {&optimizer, nullptr}; }
  trainer::RankStateParts parts() { return {model.ptr().get(), &optimizer, nullptr}; }
};

// The tensors check 2 is about: the model's parameters and buffers, the optimizer's state
// (undefined where a parameter has none), in a fixed order.
std::vector<at::Tensor> Tensors(RankState& state) {
  std::vector<at::Tensor> tensors = state.model->parameters();
  for (const at::Tensor& buffer : state.model->buffers()) tensors.push_back(buffer);
  for (const at::Tensor& param : state.optimizer.param_groups()[0].params()) {
    const auto found =
        state.optimizer.state().find(c10::guts::to_string(param.unsafeGetTensorImpl()));
    tensors.push_back(
        found == state.optimizer.state().end()
            ? at::Tensor()
            : static_cast<torch::optim::SGDParamState&>(*found->second).momentum_buffer());
  }
  return tensors;
}

// What check 2 compares: a load replaces parameters in place (Tensor::set_), so the layout
// before it is kept as values.
struct Layout {
  std::vector<int64_t> sizes;
  caffe2::TypeMeta dtype;
  c10::Device device = c10::kCPU;
  bool operator==(const Layout& other) const {
    return sizes == other.sizes && dtype == other.dtype && device == other.device;
  }
};

bool InsideStorage(const at::Tensor& t) {
  if (t.numel() == 0) return true;
  int64_t last = t.storage_offset();
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.stride(d) < 0) return false;
    last += (t.size(d) - 1) * t.stride(d);
  }
  return t.storage_offset() >= 0 &&
         static_cast<uint64_t>(last + 1) * t.itemsize() <= t.storage().nbytes();
}

std::vector<Layout> Layouts(RankState& state) {
  std::vector<Layout> layouts;
  for (const at::Tensor& t : Tensors(state)) {
    Require(t.defined() && InsideStorage(t));  // check 2
    layouts.push_back({t.sizes().vec(), t.dtype(), t.device()});
  }
  return layouts;
}

// The archive of records `input` spells (see the header), or "" when torch's writer refuses
// them (a name twice, the version record).
std::string ZipRecords(std::string_view input) {
  std::string zip;
  try {
    caffe2::serialize::PyTorchStreamWriter writer([&zip](const void* data, size_t size) {
      zip.append(static_cast<const char*>(data), size);
      return size;
    });
    while (!input.empty()) {
      const size_t name_size = static_cast<uint8_t>(input[0]);
      if (input.size() < 1 + name_size + 4) break;
      const std::string name(input.substr(1, name_size));
      uint32_t size = 0;
      for (int i = 0; i < 4; ++i)
        size |= uint32_t{static_cast<uint8_t>(input[1 + name_size + i])} << (8 * i);
      input.remove_prefix(1 + name_size + 4);
      const std::string_view content = input.substr(0, size);
      input.remove_prefix(content.size());
      writer.writeRecord(name, content.data(), content.size());
    }
    writer.writeEndOfFile();
  } catch (const std::exception&) {
    return "";
  }
  return zip;
}

void Restore(const std::string& bytes) {
  // RestoreState's first step, here before the state is made (most inputs stop at it).
  try {
    trainer::CheckCheckpointArchive(bytes);
  } catch (const gradhub::UserError&) {
    return;
  }
  RankState state;
  const std::vector<Layout> before = Layouts(state);
  try {
    std::string rank_state;
    trainer::RestoreState(bytes, *state.model, state.shared(), Spec(), 0, &rank_state);
    if (!rank_state.empty()) trainer::RestoreRankState(rank_state, state.parts());
  } catch (const std::exception&) {
    return;  // check 1: the trainer exits with a job error
  }
  Require(Layouts(state) == before);  // check 2
}

// A pipeline's checkpoint: every stage's state into the one model, as each stage's rank does
// with its own (checkpointer.cc LoadStages).
void RestorePipeline(std::string_view bytes) {
  RankState state;
  const std::vector<Layout> before = Layouts(state);
  try {
    const trainer::PipelineState pipeline = trainer::ReadPipelineState(std::string(bytes));
    for (const trainer::CheckpointBytes& stage : pipeline.stage_states) {
      trainer::RestoreRankState(stage.view(), state.parts());
    }
  } catch (const std::exception&) {
    return;  // check 1
  }
  Require(Layouts(state) == before);  // check 2
}

// The records of `archive` in this target's record format.
std::string Records(const std::string& archive) {
  std::istringstream in(archive);
  caffe2::serialize::PyTorchStreamReader reader(&in);
  std::string records;
  for (const std::string& name : reader.getAllRecords()) {
    if (name == "version" || name == ".data/version") continue;  // the writer adds it
    auto [data, size] = reader.getRecord(name);
    records += static_cast<char>(name.size());
    records += name;
    for (int i = 0; i < 4; ++i) records += static_cast<char>((size >> (8 * i)) & 0xff);
    records.append(static_cast<const char*>(data.get()), size);
  }
  return records;
}

void WriteFile(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  Require(out.good());
}

// The seed corpus: checkpoints of this target's state with and without rank states, one
// written under another spec, and the records of each.
int WriteSeeds(const fs::path& dir) {
  RankState state;
  const std::string rank_state = trainer::SerializeRankState(state.parts());
  v1::JobSpec other = Spec();
  other.set_seed(other.seed() + 1);
  const std::string pipeline = trainer::PipelineCheckpointIndex(
                                   7, "", {1.0, 2.0}, {static_cast<int64_t>(rank_state.size())}) +
                               rank_state;
  const std::vector<std::pair<std::string, std::string>> seeds = {
      {"plain", trainer::SerializeState(*state.model, state.shared(), 7, Spec())},
      {"rank_states",
       trainer::SerializeState(*state.model, state.shared(), 7, Spec(), {rank_state, rank_state})},
      {"other_spec", trainer::SerializeState(*state.model, state.shared(), 7, other)},
  };
  fs::create_directories(dir);
  for (const auto& [name, archive] : seeds) {
    WriteFile(dir / (name + ".zip"), archive);
    WriteFile(dir / (name + ".records"), Records(archive));
  }
  WriteFile(dir / "pipeline.ghpipe", pipeline);
  return 0;
}

[[maybe_unused]] const bool kSeedsWritten = [] {
  if (const char* dir = std::getenv("GRADHUB_FUZZ_WRITE_SEEDS")) std::exit(WriteSeeds(dir));
  // Every c10::Error symbolizes its stack (dladdr per frame): most of the time per input,
  // as most inputs end in one. The message is all a trainer shows.
  c10::SetStackTraceFetcher([] { return std::string(); });
  return false;
}();

}  // namespace

// No leak checks in this target: libtorch leaks a little on some malformed archives (152 bytes
// from its zip reader, seen at once; not gradhub's to fix, and a trainer exits after a load that
// failed), and libFuzzer then scans the whole heap (~700 MB of torch) after every such input,
// most of the time per input. The other targets keep theirs.
extern "C" const char* __asan_default_options() { return "detect_leaks=0"; }

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  if (input.substr(0, 2) == "PK") {
    Restore(std::string(input));
  } else if (trainer::IsPipelineCheckpoint(input)) {
    RestorePipeline(input);
  } else if (const std::string zip = ZipRecords(input); !zip.empty()) {
    Restore(zip);
  }
  return 0;
}
