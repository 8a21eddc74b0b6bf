#include <torch/script.h>

#include <algorithm>
#include <sstream>

#include "gpu_worker/models/layered.h"
#include "services/common/contract/input_file.h"
#include "services/common/contract/user_error.h"

namespace gradhub::models {
namespace {

const char kField[] = "model.torchscript.path";

// The first line of a c10::Error: the rest is a C++ backtrace users cannot act on.
std::string Headline(const std::exception& error) {
  std::string message = error.what();
  const size_t end = message.find('\n');
  return end == std::string::npos ? message : message.substr(0, end);
}

// nn::Module names may not contain dots.
std::string Flatten(std::string name) {
  std::replace(name.begin(), name.end(), '.', '_');
  return name;
}

at::Tensor RunScript(torch::jit::Module& script, const at::Tensor& x) {
  torch::jit::IValue output = script.forward({x});
  TORCH_CHECK(output.isTensor(), "forward returned ", output.tagKind(), ", not a tensor");
  return output.toTensor();
}

// Registers the very same parameter and buffer tensors of `script` on `into` under
// Flatten(prefix + their name), so that DDP's hooks, the optimizer's in-place updates and
// checkpoint loads (which set_ the tensors) all reach the scripted module without copies.
void RegisterTensorsOf(torch::nn::Module& into, const torch::jit::Module& script,
                       const std::string& prefix) {
  for (const auto& parameter : script.named_parameters(/*recurse=*/true)) {
    into.register_parameter(Flatten(prefix + parameter.name), parameter.value,
                            parameter.value.requires_grad());
  }
  for (const auto& buffer : script.named_buffers(/*recurse=*/true)) {
    into.register_buffer(Flatten(prefix + buffer.name), buffer.value);
  }
}

// The whole scripted module, running its own forward.
class TorchScriptImpl : public torch::nn::Module {
 public:
  explicit TorchScriptImpl(torch::jit::Module script) : script_(std::move(script)) {
    RegisterTensorsOf(*this, script_, "");
  }

  void train(bool on = true) override {
    torch::nn::Module::train(on);
    script_.train(on);
  }

  at::Tensor forward(const at::Tensor& x) { return RunScript(script_, x); }

 private:
  torch::jit::Module script_;
};

using NamedChild = torch::jit::NameModule;

std::vector<NamedChild> ChildrenOf(const torch::jit::Module& script) {
  std::vector<NamedChild> children;
  for (const NamedChild& child : script.named_children()) children.push_back(child);
  return children;
}

// A pipeline stage of a scripted module: some of its top-level children, run in sequence.
// Tensors are named as TorchScriptImpl names them ("<child>_<name>").
class ScriptChildrenImpl : public torch::nn::Module {
 public:
  explicit ScriptChildrenImpl(std::vector<NamedChild> children) : children_(std::move(children)) {
    for (const NamedChild& child : children_)
      RegisterTensorsOf(*this, child.value, child.name + ".");
  }

  void train(bool on = true) override {
    torch::nn::Module::train(on);
    for (NamedChild& child : children_) child.value.train(on);
  }

  at::Tensor forward(at::Tensor x) {
    for (NamedChild& child : children_) x = RunScript(child.value, x);
    return x;
  }

 private:
  std::vector<NamedChild> children_;
};

torch::jit::Module LoadScript(const std::string& path) {
  // Read through the node's input policy (data roots, regular files, size cap), then parsed
  // from memory: torch::jit::load(path) would open the name again, after the checks.
  InputFile file = OpenInputFile(path, kField);
  std::istringstream bytes(ReadAllBounded(file, kField));
  try {
    return torch::jit::load(bytes);
  } catch (const std::exception& e) {
    throw UserError(kField, path + " is not a TorchScript model (torch.jit.save): " + Headline(e));
  }
}

std::vector<int64_t> ProbeShape(const DataShape& data) {
  std::vector<int64_t> shape = {2};
  shape.insert(shape.end(), data.sample_shape.begin(), data.sample_shape.end());
  return shape;
}

// `forward` on a probe batch in eval mode and without gradients.
template <typename Forward>
at::Tensor Probe(torch::nn::Module& module, const at::Tensor& probe, Forward forward) {
  torch::NoGradGuard no_grad;
  module.eval();
  at::Tensor output = forward(probe);
  module.train();
  return output;
}

// One forward on a dummy batch turns a shape mismatch into an error that names both shapes
// now, not a failure inside the first training step.
void CheckOutputs(TorchScriptImpl& whole, const DataShape& data, const std::string& path) {
  const std::vector<int64_t> batch_shape = ProbeShape(data);
  const bool tokens = data.task == Task::kLanguageModel;
  at::Tensor probe = tokens ? torch::zeros(batch_shape, torch::kLong) : torch::zeros(batch_shape);
  at::Tensor output;
  try {
    output = Probe(whole, probe, [&](const at::Tensor& x) { return whole.forward(x); });
  } catch (const std::exception& e) {
    throw UserError(kField, path + " fails on the dataset's inputs of shape " +
                                ShapeString(batch_shape) + ": " + Headline(e));
  }
  const std::vector<int64_t> got(output.sizes().begin(), output.sizes().end());
  const int64_t want = data.task == Task::kClassification ? data.num_classes
                       : tokens                           ? data.vocab_size
                                                          : 1;
  if (got.empty() || got.front() != 2 || got.back() < want ||
      (data.task == Task::kRegression && output.numel() != 2)) {
    throw UserError(kField, path + " maps inputs " + ShapeString(batch_shape) + " to " +
                                ShapeString(got) + "; the dataset needs " +
                                (data.task == Task::kRegression
                                     ? std::string("one prediction per sample")
                                     : std::to_string(want) + " outputs per sample"));
  }
}

// Random, not zeros: x + f(x) and f(x) agree at x = 0, so zeros would hide a residual.
at::Tensor RandomProbe(const DataShape& data) {
  at::Generator generator = at::detail::createCPUGenerator(/*seed_val=*/20240533);
  if (data.task == Task::kLanguageModel) {
    return at::randint(std::max<int64_t>(data.vocab_size, 1), ProbeShape(data), generator,
                       at::kLong);
  }
  return at::randn(ProbeShape(data), generator);
}

// Why running the children in order is not the module's forward, or "" when it is.
std::string WhyNotASequence(torch::jit::Module& script, const DataShape& data) {
  if (script.named_parameters(/*recurse=*/false).size() > 0 ||
      script.named_buffers(/*recurse=*/false).size() > 0) {
    return "it has parameters or buffers of its own, outside its children";
  }
  const at::Tensor probe = RandomProbe(data);
  auto sequence = std::make_shared<ScriptChildrenImpl>(ChildrenOf(script));
  TorchScriptImpl whole(script);
  at::Tensor in_order, own;
  try {
    in_order = Probe(*sequence, probe, [&](const at::Tensor& x) { return sequence->forward(x); });
  } catch (const std::exception& e) {
    return "running its children in order fails: " + Headline(e);
  }
  own = Probe(whole, probe, [&](const at::Tensor& x) { return whole.forward(x); });
  if (in_order.sizes() != own.sizes() || in_order.scalar_type() != own.scalar_type() ||
      !at::allclose(in_order, own, /*rtol=*/1e-5, /*atol=*/1e-6)) {
    return "running its children in order gives a different output than its forward (a "
           "residual or a branch across children?)";
  }
  return "";
}

}  // namespace

LayeredModel LayersOfTorchScript(const v1::TorchScriptModel& spec, const DataShape& data) {
  const std::string path = spec.path();
  torch::jit::Module script = LoadScript(path);
  auto whole = std::make_shared<TorchScriptImpl>(script);
  if (whole->parameters().empty()) throw UserError(kField, path + " has no parameters to train");
  CheckOutputs(*whole, data, path);
  const std::vector<NamedChild> children = ChildrenOf(script);
  const int64_t count = std::max<int64_t>(static_cast<int64_t>(children.size()), 1);
  auto checked = std::make_shared<bool>(false);
  auto build_stage = [=](StageRange range) mutable -> std::unique_ptr<Model> {
    CheckStageRange(range, count);
    if (range.size() == count) return MakeModel(whole, "torchscript " + path);
    if (!*checked) {
      const std::string why = WhyNotASequence(script, data);
      if (!why.empty()) {
        throw UserError(kField, path +
                                    " cannot be split into pipeline stages by its top-level "
                                    "children (parallelism.pipelineStages above 1): " +
                                    why + "; model.torchscript must then train unsplit");
      }
      *checked = true;
    }
    std::vector<NamedChild> slice(children.begin() + range.first_layer,
                                  children.begin() + range.end_layer);
    return MakeModel(std::make_shared<ScriptChildrenImpl>(std::move(slice)),
                     "torchscript " + path + ", children [" + std::to_string(range.first_layer) +
                         ", " + std::to_string(range.end_layer) + ") of " + std::to_string(count));
  };
  return {count, std::move(build_stage)};
}

}  // namespace gradhub::models
