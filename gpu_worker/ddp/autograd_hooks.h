#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

namespace torch::autograd {
struct Node;
}

namespace gradhub::ddp {

// The engine's only contact with autograd internals (grad accumulators, post-hooks, graph
// edges), kept in one place because that API differs between libtorch versions while the
// tensor API does not.
class GradientReadyHooks {
 public:
  // After each backward accumulates parameter i's gradient into .grad, calls on_ready(i) on
  // the autograd thread.
  GradientReadyHooks(const std::vector<at::Tensor>& parameters,
                     std::function<void(size_t)> on_ready);
  ~GradientReadyHooks();
  GradientReadyHooks(const GradientReadyHooks&) = delete;
  GradientReadyHooks& operator=(const GradientReadyHooks&) = delete;

  // Indices of the parameters whose gradient a backward from `outputs` would not produce.
  std::vector<size_t> Unreachable(const std::vector<at::Tensor>& outputs) const;

  // Runs `callback` once the backward now running has computed every gradient, on the thread
  // that ran it, before backward() returns; what it throws, backward() throws. Only from
  // inside a backward (a hook); throws c10::Error otherwise.
  static void QueueAtEndOfBackward(std::function<void()> callback);

 private:
  // Held so the accumulators (and our hooks on them) live as long as we do.
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;
  std::vector<uintptr_t> hook_keys_;
};

}  // namespace gradhub::ddp
