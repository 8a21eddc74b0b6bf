#include "gpu_worker/trainer/pipeline_checkpoint_format.h"

#include <cstring>

#include "services/common/contract/user_error.h"

namespace gradhub::trainer {
namespace {

static_assert(sizeof(double) == 8, "layer costs are IEEE-754 binary64");

template <typename T>
void Put(std::string& out, T value) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));  // little-endian hosts only (x86-64, aarch64)
  out.append(bytes, sizeof(T));
}

[[noreturn]] void Refuse(const std::string& why) {
  throw UserError("checkpoint", "is not a pipeline checkpoint gradhub writes: " + why);
}

// Reads fields front to back, refusing any that would run past the end.
class Fields {
 public:
  explicit Fields(std::string_view bytes) : rest_(bytes) {}

  template <typename T>
  T Next(const char* field) {
    if (rest_.size() < sizeof(T)) Refuse(std::string(field) + " runs past the end");
    T value;
    std::memcpy(&value, rest_.data(), sizeof(T));
    rest_.remove_prefix(sizeof(T));
    return value;
  }

  // A count of items of `item_bytes` each, which must fit in what is left.
  uint64_t Count(const char* field, size_t item_bytes) {
    const uint64_t count = Next<uint64_t>(field);
    if (count > rest_.size() / item_bytes) {
      Refuse(std::string(field) + " " + std::to_string(count) + " is more than the index holds");
    }
    return count;
  }

  std::string_view Take(size_t size) {
    std::string_view taken = rest_.substr(0, size);
    rest_.remove_prefix(size);
    return taken;
  }

  size_t left() const { return rest_.size(); }

 private:
  std::string_view rest_;
};

}  // namespace

std::string PipelineCheckpointIndex(int64_t step, std::string_view spec,
                                    const std::vector<double>& layer_costs,
                                    const std::vector<int64_t>& stage_sizes) {
  std::string index;
  Put<int64_t>(index, step);
  Put<uint64_t>(index, spec.size());
  index.append(spec);
  Put<uint64_t>(index, layer_costs.size());
  for (double cost : layer_costs) Put<double>(index, cost);
  Put<uint64_t>(index, stage_sizes.size());
  for (int64_t size : stage_sizes) Put<uint64_t>(index, static_cast<uint64_t>(size));
  std::string header(kPipelineCheckpointMagic);
  Put<uint64_t>(header, index.size());
  return header + index;
}

bool IsPipelineCheckpoint(std::string_view bytes) {
  return bytes.substr(0, kPipelineCheckpointMagic.size()) == kPipelineCheckpointMagic;
}

PipelineCheckpoint ReadPipelineCheckpoint(const CheckpointBytes& bytes) {
  if (!IsPipelineCheckpoint(bytes.view())) Refuse("no magic");
  Fields header(bytes.view().substr(kPipelineCheckpointMagic.size()));
  const uint64_t index_size = header.Next<uint64_t>("index_size");
  if (index_size > header.left()) Refuse("index_size runs past the end");
  const size_t stages_start = bytes.size() - header.left() + index_size;
  Fields index(header.Take(index_size));
  PipelineCheckpoint checkpoint;
  checkpoint.step = index.Next<int64_t>("step");
  if (checkpoint.step < 0) Refuse("step " + std::to_string(checkpoint.step));
  checkpoint.spec = std::string(index.Take(index.Count("spec_size", 1)));
  const uint64_t costs = index.Count("cost_count", sizeof(double));
  for (uint64_t i = 0; i < costs; ++i) checkpoint.layer_costs.push_back(index.Next<double>("cost"));
  const uint64_t stages = index.Count("stage_count", sizeof(uint64_t));
  if (index.left() != stages * sizeof(uint64_t)) Refuse("the index has bytes after its fields");
  size_t offset = stages_start;
  for (uint64_t stage = 0; stage < stages; ++stage) {
    const uint64_t size = index.Next<uint64_t>("stage size");
    if (size > bytes.size() - offset) {
      Refuse("stage " + std::to_string(stage) + "'s " + std::to_string(size) +
             " bytes run past the end");
    }
    checkpoint.stage_states.push_back(bytes.Slice(offset, size));
    offset += size;
  }
  if (offset != bytes.size()) {
    Refuse(std::to_string(bytes.size() - offset) + " bytes follow the last stage");
  }
  return checkpoint;
}

}  // namespace gradhub::trainer
