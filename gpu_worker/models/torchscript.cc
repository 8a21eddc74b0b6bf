#include <torch/script.h>

#include <algorithm>
#include <sstream>

#include "gpu_worker/models/architectures.h"
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

// Presents a scripted module as a torch::nn::Module by registering the very same parameter
// and buffer tensors: DDP's hooks, the optimizer's in-place updates and checkpoint loads
// (which set_ the tensors) all reach the scripted module without copies.
class TorchScriptImpl : public torch::nn::Module {
 public:
  explicit TorchScriptImpl(torch::jit::Module script) : script_(std::move(script)) {
    for (const auto& parameter : script_.named_parameters(/*recurse=*/true)) {
      register_parameter(Flatten(parameter.name), parameter.value, parameter.value.requires_grad());
    }
    for (const auto& buffer : script_.named_buffers(/*recurse=*/true)) {
      register_buffer(Flatten(buffer.name), buffer.value);
    }
  }

  void train(bool on = true) override {
    torch::nn::Module::train(on);
    script_.train(on);
  }

  at::Tensor forward(const at::Tensor& x) {
    torch::jit::IValue output = script_.forward({x});
    TORCH_CHECK(output.isTensor(), "forward returned ", output.tagKind(), ", not a tensor");
    return output.toTensor();
  }

 private:
  // nn::Module names may not contain dots.
  static std::string Flatten(std::string name) {
    std::replace(name.begin(), name.end(), '.', '_');
    return name;
  }

  torch::jit::Module script_;
};

}  // namespace

std::unique_ptr<Model> BuildTorchScript(const v1::TorchScriptModel& spec, const DataShape& data) {
  const std::string& path = spec.path();
  // Read through the node's input policy (data roots, regular files, size cap), then parsed
  // from memory: torch::jit::load(path) would open the name again, after the checks.
  InputFile file = OpenInputFile(path, kField);
  std::istringstream bytes(ReadAllBounded(file, kField));
  torch::jit::Module script;
  try {
    script = torch::jit::load(bytes);
  } catch (const std::exception& e) {
    throw UserError(kField, path + " is not a TorchScript model (torch.jit.save): " + Headline(e));
  }
  auto impl = std::make_shared<TorchScriptImpl>(std::move(script));
  if (impl->parameters().empty()) {
    throw UserError(kField, path + " has no parameters to train");
  }

  // One forward on a dummy batch turns a shape mismatch into an error that names both
  // shapes now, not a failure inside the first training step.
  std::vector<int64_t> batch_shape = {2};
  batch_shape.insert(batch_shape.end(), data.sample_shape.begin(), data.sample_shape.end());
  const bool tokens = data.task == Task::kLanguageModel;
  at::Tensor probe = tokens ? torch::zeros(batch_shape, torch::kLong) : torch::zeros(batch_shape);
  at::Tensor output;
  try {
    torch::NoGradGuard no_grad;
    impl->eval();
    output = impl->forward(probe);
    impl->train();
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
  return MakeModel(std::move(impl), "torchscript " + path);
}

}  // namespace gradhub::models
