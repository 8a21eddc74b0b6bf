#include "gpu_worker/trainer/checkpoint_state.h"

#include <google/protobuf/util/message_differencer.h>
#include <torch/torch.h>

#include "gpu_worker/common/data_shape.h"
#include "gpu_worker/ddp/comm_hook.h"
#include "gpu_worker/trainer/checkpoint_archive.h"
#include "gpu_worker/trainer/pipeline_checkpoint_format.h"
#include "services/common/contract/user_error.h"

namespace gradhub::trainer {
namespace {

// Archive keys. "spec" was added with the checkpoint store; older checkpoints lack it.
constexpr char kModel[] = "model";
constexpr char kOptimizer[] = "optimizer";
constexpr char kStep[] = "step";
constexpr char kSpec[] = "spec";
// A pipeline's layer costs, float64, one per layer (SerializePipelineState).
constexpr char kLayerCosts[] = "layer_costs";
// Added with sharded and per-rank state: "rank_state_<rank>", a SerializeRankState each.
constexpr char kRankState[] = "rank_state_";
// Added with pipeline stages: "stage_state_<stage>", a SerializeRankState of the stage's module
// and optimizer each, in a checkpoint without "model" and "optimizer" (SerializePipelineState).
constexpr char kStageState[] = "stage_state_";
// A comm hook's state is saved under its name(): "powersgd" for PowerSGD, as before hooks
// were open.
// Added with precision FP16: ddp::LossScaler::State, an archive of three scalar tensors.
constexpr char kLossScaler[] = "loss_scaler";
constexpr char kScale[] = "scale";
constexpr char kGrowthTracker[] = "growth_tracker";
constexpr char kSkippedSteps[] = "skipped_steps";

std::string ArchiveBytes(torch::serialize::OutputArchive& archive) {
  std::string bytes;
  archive.save_to([&bytes](const void* data, size_t size) {
    bytes.append(static_cast<const char*>(data), size);
    return size;
  });
  return bytes;
}

// Field paths (proto names) that differ, e.g. "optimizer.sgd.lr, seed".
std::string ChangedFields(const v1::JobSpec& saved, const v1::JobSpec& now) {
  std::string report;
  {
    google::protobuf::util::MessageDifferencer differ;
    google::protobuf::io::StringOutputStream out(&report);
    google::protobuf::util::MessageDifferencer::StreamReporter reporter(&out);
    differ.ReportDifferencesTo(&reporter);
    differ.Compare(saved, now);
  }
  // The reporter writes one "modified: a.b: x -> y" line per field; keep it short.
  if (report.size() > 600) report = report.substr(0, 600) + "...";
  while (!report.empty() && report.back() == '\n') report.pop_back();
  for (char& c : report) {
    if (c == '\n') c = ';';
  }
  return report;
}

void WriteLossScaler(const ddp::LossScaler::State& state,
                     torch::serialize::OutputArchive& archive) {
  torch::serialize::OutputArchive part;
  part.write(kScale, torch::tensor(state.scale, at::kDouble));
  part.write(kGrowthTracker, torch::tensor(state.growth_tracker, at::kLong));
  part.write(kSkippedSteps, torch::tensor(state.skipped_steps, at::kLong));
  archive.write(kLossScaler, part);
}

// Leaves `state` as it is when the archive has none (a checkpoint from before FP16).
void ReadLossScaler(torch::serialize::InputArchive& archive, ddp::LossScaler::State& state) {
  torch::serialize::InputArchive part;
  if (!archive.try_read(kLossScaler, part)) return;
  at::Tensor scale, growth_tracker, skipped_steps;
  part.read(kScale, scale);
  part.read(kGrowthTracker, growth_tracker);
  part.read(kSkippedSteps, skipped_steps);
  state.scale = scale.item<double>();
  state.growth_tracker = growth_tracker.item<int64_t>();
  state.skipped_steps = skipped_steps.item<int64_t>();
}

// What a tensor must keep through a load. torch's loaders replace a parameter's data with the
// archive's tensor (Tensor::set_), so an archive could give it another shape, type or device,
// and the step after would fail far from the cause, or (a shape that still broadcasts) train
// something else. A load is checked against the layout taken before it.
struct Layout {
  std::string name;
  std::vector<int64_t> sizes;
  caffe2::TypeMeta dtype;
  c10::Device device = c10::kCPU;
};

Layout LayoutOf(std::string name, const at::Tensor& t) {
  return {std::move(name), t.sizes().vec(), t.dtype(), t.device()};
}

std::string Describe(const std::vector<int64_t>& sizes, caffe2::TypeMeta dtype,
                     const c10::Device& device) {
  return ShapeString(sizes) + " " + std::string(dtype.name()) + " on " + device.str();
}

// Whether every element `t` can address lies in its storage. An archive spells each tensor's
// offset and strides itself, so one could point a parameter past its data (found by
// checkpoint_state_fuzz): reads and the optimizer's writes would then leave the buffer.
bool InsideItsStorage(const at::Tensor& t) {
  if (t.numel() == 0) return true;
  if (t.storage_offset() < 0) return false;
  int64_t last = t.storage_offset();
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.stride(d) < 0) return false;
    last += (t.size(d) - 1) * t.stride(d);
  }
  return static_cast<uint64_t>(last + 1) * t.itemsize() <= t.storage().nbytes();
}

void RequireLayout(const Layout& want, const at::Tensor& got) {
  if (got.defined() && got.sizes() == want.sizes && got.dtype() == want.dtype &&
      got.device() == want.device) {
    if (InsideItsStorage(got)) return;
    throw UserError("checkpoint", want.name + "'s offset and strides reach past its data");
  }
  throw UserError("checkpoint",
                  want.name + " is " +
                      (got.defined() ? Describe(got.sizes().vec(), got.dtype(), got.device())
                                     : std::string("missing")) +
                      " in the checkpoint; the model's is " +
                      Describe(want.sizes, want.dtype, want.device));
}

// The module's parameters and buffers, by name.
std::vector<Layout> ModuleLayout(torch::nn::Module& module) {
  std::vector<Layout> layout;
  for (const auto& item : module.named_parameters())
    layout.push_back(LayoutOf(item.key(), item.value()));
  for (const auto& item : module.named_buffers())
    layout.push_back(LayoutOf(item.key(), item.value()));
  return layout;
}

void RequireModuleLayout(const std::vector<Layout>& before, torch::nn::Module& module) {
  const std::vector<Layout> after = ModuleLayout(module);
  if (after.size() != before.size()) throw UserError("checkpoint", "the model's tensors changed");
  size_t i = 0;
  for (const auto& item : module.named_parameters()) RequireLayout(before[i++], item.value());
  for (const auto& item : module.named_buffers()) RequireLayout(before[i++], item.value());
}

// The tensors of one parameter's optimizer state, for the optimizers the trainer makes
// (optimization.cc); each has its parameter's layout.
std::vector<at::Tensor> StateTensors(const torch::optim::OptimizerParamState& state) {
  if (auto* sgd = dynamic_cast<const torch::optim::SGDParamState*>(&state)) {
    return {sgd->momentum_buffer()};
  }
  if (auto* adam = dynamic_cast<const torch::optim::AdamParamState*>(&state)) {
    return {adam->exp_avg(), adam->exp_avg_sq(), adam->max_exp_avg_sq()};
  }
  if (auto* adamw = dynamic_cast<const torch::optim::AdamWParamState*>(&state)) {
    return {adamw->exp_avg(), adamw->exp_avg_sq(), adamw->max_exp_avg_sq()};
  }
  return {};
}

void RequireOptimizerLayout(torch::optim::Optimizer& optimizer) {
  for (const torch::optim::OptimizerParamGroup& group : optimizer.param_groups()) {
    for (const at::Tensor& param : group.params()) {
      const auto state = optimizer.state().find(c10::guts::to_string(param.unsafeGetTensorImpl()));
      if (state == optimizer.state().end()) continue;
      for (const at::Tensor& t : StateTensors(*state->second)) {
        if (t.defined()) RequireLayout(LayoutOf("the optimizer's state", param), t);
      }
    }
  }
}

// Loads `archive` into `module` and checks it kept its layout.
void LoadModule(torch::serialize::InputArchive& archive, torch::nn::Module& module) {
  const std::vector<Layout> before = ModuleLayout(module);
  try {
    module.load(archive);
  } catch (const c10::Error& error) {
    // The spec matched (RequireSameSpec), so the model is the same; its names are not: the
    // checkpoint was written by a gradhub whose zoo models named their parameters otherwise.
    // A user error, so that the job fails once, saying why, instead of restarting in vain.
    throw UserError("checkpoint",
                    "its parameters are not named as this model's (" +
                        std::string(error.what_without_backtrace()) +
                        "): it was written by an older gradhub, before the zoo's models became "
                        "lists of layers (linear0.weight is now layers.0.linear.weight, issue "
                        "33), and cannot be resumed; submit the job again to start afresh");
  }
  RequireModuleLayout(before, module);
}

void LoadOptimizer(torch::serialize::InputArchive& archive, torch::optim::Optimizer& optimizer) {
  optimizer.load(archive);
  RequireOptimizerLayout(optimizer);
}

}  // namespace

v1::JobSpec ResumeRelevantSpec(const v1::JobSpec& spec) {
  v1::JobSpec relevant = spec;
  if (relevant.lr_schedule().has_cosine() && relevant.lr_schedule().cosine().period_steps() <= 0) {
    relevant.mutable_lr_schedule()->mutable_cosine()->set_period_steps(relevant.max_steps());
  }
  relevant.clear_display_name();
  relevant.clear_labels();
  relevant.clear_max_steps();
  relevant.clear_max_epochs();
  relevant.clear_eval_every_steps();
  relevant.clear_log_every_steps();
  relevant.clear_checkpoint();
  relevant.clear_max_restarts();
  relevant.clear_hang_timeout_seconds();
  relevant.clear_priority();
  relevant.clear_node_selector();
  relevant.mutable_distributed()->clear_ranks_per_node();
  relevant.mutable_distributed()->clear_collective_timeout_seconds();
  relevant.mutable_dataset()->clear_prefetch_batches();
  return relevant;
}

void RequireSameSpec(const std::string& saved_spec, const v1::JobSpec& spec) {
  v1::JobSpec saved;
  const v1::JobSpec now = ResumeRelevantSpec(spec);
  if (!saved.ParseFromString(saved_spec) ||
      !google::protobuf::util::MessageDifferencer::Equals(saved, now)) {
    throw UserError("spec",
                    "changed since the checkpoint was written, in fields that decide "
                    "the result (" +
                        ChangedFields(saved, now) +
                        "); submit it as a new job, or change only harmless fields");
  }
}

namespace {

// The kLayerCosts record of an archived pipeline checkpoint; empty when it has none.
std::vector<double> LayerCostsOf(torch::serialize::InputArchive& archive) {
  at::Tensor costs;
  if (!archive.try_read(kLayerCosts, costs)) return {};
  costs = costs.to(at::kDouble).contiguous();
  return std::vector<double>(costs.data_ptr<double>(), costs.data_ptr<double>() + costs.numel());
}

// Checks `bytes` (checkpoint_archive.h), then loads them in place: no copy of them is made
// (an istringstream would hold one).
void LoadArchive(std::string_view bytes, torch::serialize::InputArchive& archive,
                 const c10::Device& device = c10::kCPU) {
  CheckCheckpointArchive(bytes);
  archive.load_from(bytes.data(), bytes.size(), device);
}

// A pipeline checkpoint written before pipeline_checkpoint_format.h: a torch archive of the
// step, the spec, the layer costs and every stage's state as a string.
PipelineState ReadArchivedPipelineState(std::string_view bytes) {
  torch::serialize::InputArchive archive;
  LoadArchive(bytes, archive);  // no tensors but the step and the costs: stage states are strings
  PipelineState state;
  at::Tensor step;
  archive.read(kStep, step);
  state.step = step.item<int64_t>();
  c10::IValue value;
  if (archive.try_read(kSpec, value)) state.spec = value.toStringRef();
  state.layer_costs = LayerCostsOf(archive);
  for (int stage = 0; archive.try_read(kStageState + std::to_string(stage), value); ++stage) {
    state.stage_states.emplace_back(value.toStringRef());
  }
  return state;
}

}  // namespace

std::vector<double> ReadPipelineLayerCosts(const CheckpointBytes& bytes) {
  if (IsPipelineCheckpoint(bytes.view())) return ReadPipelineCheckpoint(bytes).layer_costs;
  torch::serialize::InputArchive archive;
  LoadArchive(bytes.view(), archive);
  return LayerCostsOf(archive);
}

PipelineState ReadPipelineState(const CheckpointBytes& bytes) {
  if (!IsPipelineCheckpoint(bytes.view())) return ReadArchivedPipelineState(bytes.view());
  PipelineCheckpoint read = ReadPipelineCheckpoint(bytes);
  return PipelineState{read.step, std::move(read.spec), std::move(read.layer_costs),
                       std::move(read.stage_states)};
}

namespace {

torch::serialize::OutputArchive RankStateArchive(const RankStateParts& parts) {
  torch::serialize::OutputArchive archive;
  if (parts.module) {
    torch::serialize::OutputArchive part;
    parts.module->save(part);
    archive.write(kModel, part);
  }
  if (parts.optimizer) {
    torch::serialize::OutputArchive part;
    parts.optimizer->save(part);
    archive.write(kOptimizer, part);
  }
  if (parts.comm_hook) {
    torch::serialize::OutputArchive part;
    parts.comm_hook->Save(part);
    archive.write(parts.comm_hook->name(), part);
  }
  return archive;
}

}  // namespace

std::string SerializeRankState(const RankStateParts& parts) {
  torch::serialize::OutputArchive archive = RankStateArchive(parts);
  return ArchiveBytes(archive);
}

void WriteRankState(const RankStateParts& parts, ScratchFile& file) {
  // torch writes each tensor's bytes straight from its storage (a GPU's through one host copy
  // at a time), so the rank holds no copy of its state.
  RankStateArchive(parts).save_to([&file](const void* data, size_t size) {
    file.Append(std::string_view(static_cast<const char*>(data), size));
    return size;
  });
}

void RestoreRankState(std::string_view bytes, const RankStateParts& parts,
                      const c10::Device& device) {
  torch::serialize::InputArchive archive;
  LoadArchive(bytes, archive, device);
  if (parts.module) {
    torch::serialize::InputArchive part;
    archive.read(kModel, part);
    LoadModule(part, *parts.module);
  }
  if (parts.optimizer) {
    torch::serialize::InputArchive part;
    archive.read(kOptimizer, part);
    LoadOptimizer(part, *parts.optimizer);
  }
  if (parts.comm_hook) {
    torch::serialize::InputArchive part;
    archive.read(parts.comm_hook->name(), part);
    parts.comm_hook->Load(part);
  }
}

std::string SerializeState(torch::nn::Module& module, const SharedUpdateState& update, int64_t step,
                           const v1::JobSpec& spec, const std::vector<std::string>& rank_states,
                           std::string memory) {
  torch::serialize::OutputArchive archive, model_archive, optimizer_archive;
  module.save(model_archive);
  archive.write(kModel, model_archive);
  if (update.optimizer) {
    update.optimizer->save(optimizer_archive);
    archive.write(kOptimizer, optimizer_archive);
  }
  archive.write(kStep, torch::tensor(step));
  archive.write(kSpec, c10::IValue(ResumeRelevantSpec(spec).SerializeAsString()));
  for (size_t rank = 0; rank < rank_states.size(); ++rank) {
    archive.write(kRankState + std::to_string(rank), c10::IValue(rank_states[rank]));
  }
  if (update.loss_scaler) WriteLossScaler(update.loss_scaler->state(), archive);
  // Appended straight into one string reserved for the whole state: an ostringstream would
  // copy every byte again on each growth and once more in str().
  std::string bytes = std::move(memory);
  bytes.clear();
  int64_t state_bytes = 0;
  for (const at::Tensor& t : module.parameters()) state_bytes += t.nbytes();
  for (const at::Tensor& t : module.buffers()) state_bytes += t.nbytes();
  for (const std::string& rank_state : rank_states) state_bytes += rank_state.size() / 3;
  bytes.reserve(static_cast<size_t>(state_bytes) * 3 + (1 << 20));  // momentum, Adam's moments
  archive.save_to([&bytes](const void* data, size_t size) {
    bytes.append(static_cast<const char*>(data), size);
    return size;
  });
  return bytes;
}

int64_t RestoreState(const std::string& bytes, torch::nn::Module& module,
                     const SharedUpdateState& update, const v1::JobSpec& spec, int rank,
                     std::string* rank_state, const c10::Device& device) {
  torch::serialize::InputArchive archive, model_archive, optimizer_archive;
  // Read straight onto the module's device: a tensor read onto another device would replace
  // the parameter's data (set_data) rather than fill it, and a CUDA tensor cannot be read at
  // all where there is no GPU.
  LoadArchive(bytes, archive, device);
  c10::IValue saved_spec;
  if (archive.try_read(kSpec, saved_spec)) RequireSameSpec(saved_spec.toStringRef(), spec);
  archive.read(kModel, model_archive);
  LoadModule(model_archive, module);
  if (update.optimizer) {
    archive.read(kOptimizer, optimizer_archive);
    LoadOptimizer(optimizer_archive, *update.optimizer);
  }
  if (rank_state) {
    c10::IValue saved;
    *rank_state = archive.try_read(kRankState + std::to_string(rank), saved) ? saved.toStringRef()
                                                                             : std::string();
  }
  if (update.loss_scaler) {
    ddp::LossScaler::State state = update.loss_scaler->state();
    ReadLossScaler(archive, state);
    update.loss_scaler->set_state(state);
  }
  at::Tensor step;
  archive.read(kStep, step);
  return step.item<int64_t>();
}

}  // namespace gradhub::trainer
