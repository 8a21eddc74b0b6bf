#include "gpu_worker/ddp/zero_redundancy_optimizer.h"

#include <ATen/ATen.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <numeric>
#include <stdexcept>

namespace gradhub::ddp {
namespace {

int64_t Bytes(const at::Tensor& tensor) { return tensor.defined() ? tensor.nbytes() : 0; }

int64_t StateBytes(const torch::optim::OptimizerParamState& state) {
  if (auto* sgd = dynamic_cast<const torch::optim::SGDParamState*>(&state)) {
    return Bytes(sgd->momentum_buffer());
  }
  if (auto* adam = dynamic_cast<const torch::optim::AdamParamState*>(&state)) {
    return Bytes(adam->exp_avg()) + Bytes(adam->exp_avg_sq()) + Bytes(adam->max_exp_avg_sq());
  }
  if (auto* adamw = dynamic_cast<const torch::optim::AdamWParamState*>(&state)) {
    return Bytes(adamw->exp_avg()) + Bytes(adamw->exp_avg_sq()) + Bytes(adamw->max_exp_avg_sq());
  }
  return 0;
}

}  // namespace

std::vector<int> PartitionParameters(const std::vector<at::Tensor>& parameters, int world_size) {
  if (world_size < 1) throw std::invalid_argument("PartitionParameters: world_size < 1");
  std::vector<size_t> by_size(parameters.size());
  std::iota(by_size.begin(), by_size.end(), 0);
  std::stable_sort(by_size.begin(), by_size.end(), [&](size_t a, size_t b) {
    return parameters[a].numel() > parameters[b].numel();
  });
  std::vector<int64_t> load(world_size, 0);
  std::vector<int> owners(parameters.size(), 0);
  for (size_t index : by_size) {
    const int rank = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    owners[index] = rank;
    load[rank] += parameters[index].numel();
  }
  return owners;
}

int64_t OptimizerStateBytes(const torch::optim::Optimizer& optimizer) {
  int64_t bytes = 0;
  for (const auto& item : optimizer.state()) bytes += StateBytes(*item.second);
  return bytes;
}

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(std::vector<at::Tensor> parameters,
                                                 std::shared_ptr<ProcessGroup> group,
                                                 const OptimizerFactory& make_local)
    : parameters_(std::move(parameters)),
      group_(std::move(group)),
      owners_(PartitionParameters(parameters_, group_->size())),
      by_owner_(group_->size()) {
  std::vector<at::Tensor> mine;
  for (size_t i = 0; i < parameters_.size(); ++i) {
    by_owner_[owners_[i]].push_back(i);
    if (owners_[i] == group_->rank()) mine.push_back(parameters_[i]);
  }
  local_ = make_local(std::move(mine));
}

void ZeroRedundancyOptimizer::Step() {
  local_->step();
  if (group_->size() == 1) return;
  // Issued in rank order and waited for together: the order is the same on every rank.
  std::vector<std::shared_ptr<Work>> works;
  for (int owner = 0; owner < group_->size(); ++owner) {
    if (by_owner_[owner].empty()) continue;
    // Detached here, not once: loading a checkpoint gives a parameter new storage (set_),
    // which an alias made earlier would not see.
    std::vector<at::Tensor> owned;
    for (size_t index : by_owner_[owner]) owned.push_back(parameters_[index].detach());
    works.push_back(group_->Broadcast(std::move(owned), owner));
  }
  for (auto& work : works) work->Wait();
}

}  // namespace gradhub::ddp
