#include "gpu_worker/ddp/autograd_hooks.h"

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <stdexcept>
#include <unordered_set>

namespace gradhub::ddp {

using torch::autograd::Node;

GradientReadyHooks::GradientReadyHooks(const std::vector<at::Tensor>& parameters,
                                       std::function<void(size_t)> on_ready) {
  for (size_t index = 0; index < parameters.size(); ++index) {
    if (!parameters[index].requires_grad()) {
      throw std::invalid_argument("parameter " + std::to_string(index) + " does not require grad");
    }
    std::shared_ptr<Node> accumulator = torch::autograd::impl::grad_accumulator(parameters[index]);
    hook_keys_.push_back(
        accumulator->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
            [on_ready, index](const torch::autograd::variable_list& outputs,
                              const torch::autograd::variable_list& /*inputs*/) {
              on_ready(index);
              return outputs;
            })));
    accumulators_.push_back(std::move(accumulator));
  }
}

GradientReadyHooks::~GradientReadyHooks() {
  for (size_t i = 0; i < accumulators_.size(); ++i) accumulators_[i]->del_post_hook(hook_keys_[i]);
}

void GradientReadyHooks::QueueAtEndOfBackward(std::function<void()> callback) {
  // The engine's callbacks hang off the graph task of the calling thread, so any engine
  // instance (the Python engine when torch's Python module is loaded) takes them alike.
  torch::autograd::Engine::get_default_engine().queue_callback(std::move(callback));
}

std::vector<size_t> GradientReadyHooks::Unreachable(const std::vector<at::Tensor>& outputs) const {
  std::unordered_set<const Node*> seen;
  std::vector<const Node*> stack;
  for (const at::Tensor& output : outputs) {
    if (!output.defined() || !output.requires_grad()) continue;
    const Node* root = output.grad_fn()
                           ? output.grad_fn().get()
                           : torch::autograd::impl::try_get_grad_accumulator(output).get();
    if (root != nullptr && seen.insert(root).second) stack.push_back(root);
  }
  while (!stack.empty()) {
    const Node* node = stack.back();
    stack.pop_back();
    for (const auto& edge : node->next_edges()) {
      const Node* next = edge.function.get();
      if (next != nullptr && seen.insert(next).second) stack.push_back(next);
    }
  }
  std::vector<size_t> unreachable;
  for (size_t i = 0; i < accumulators_.size(); ++i) {
    if (seen.count(accumulators_[i].get()) == 0) unreachable.push_back(i);
  }
  return unreachable;
}

}  // namespace gradhub::ddp
