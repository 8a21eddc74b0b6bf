#include "gpu_worker/trainer/forward_pass.h"

#include <torch/torch.h>

#include <cmath>

#include "gpu_worker/data/batch_loader.h"

namespace gradhub::trainer {
namespace {

EvalSums SumBatches(models::Model& model, const data::Dataset& dataset,
                    const std::vector<int64_t>& mine, const TrainingPlan& plan,
                    const c10::Device& device) {
  EvalSums sums(device);
  torch::NoGradGuard no_grad;
  data::BatchLoader loader(dataset, mine, plan.batches.per_rank, /*drop_last=*/false,
                           /*prefetch=*/2, /*start_batch=*/0, /*pin_memory=*/device.is_cuda());
  at::Tensor x, y;
  while (loader.Next(&x, &y)) {
    x = ToDevice(x, device);
    y = ToDevice(y, device);
    PrecisionScope precision(plan.autocast, device.type());
    sums.Add(dataset.shape().task, model.Forward(x), y);
  }
  return sums;
}

}  // namespace

at::Tensor Loss(Task task, const at::Tensor& output, const at::Tensor& target) {
  switch (task) {
    case Task::kClassification:
      return torch::cross_entropy_loss(output, target);
    case Task::kRegression:
      return torch::mse_loss(output.reshape({-1}), target.reshape({-1}).to(output.scalar_type()));
    case Task::kLanguageModel:
      return torch::cross_entropy_loss(output.reshape({-1, output.size(-1)}), target.reshape({-1}));
  }
  return {};
}

at::Tensor ToDevice(const at::Tensor& tensor, const c10::Device& device) {
  return device.is_cpu() ? tensor : tensor.to(device, /*non_blocking=*/true);
}

PrecisionScope::PrecisionScope(Autocast autocast, c10::DeviceType device) {
  if (autocast == Autocast::kBfloat16) autocast_.emplace(device, at::kBFloat16);
  if (autocast == Autocast::kFloat16) autocast_.emplace(device, at::kHalf);
}

EvalSums::EvalSums(const c10::Device& device)
    : loss_(torch::zeros({}, at::TensorOptions().dtype(at::kDouble).device(device))),
      correct_(torch::zeros_like(loss_)) {}

void EvalSums::Add(Task task, const at::Tensor& output, const at::Tensor& target) {
  const double items = task == Task::kLanguageModel ? static_cast<double>(target.numel())
                                                    : static_cast<double>(target.size(0));
  loss_ += Loss(task, output, target).to(at::kDouble) * items;
  if (task == Task::kClassification) correct_ += output.argmax(1).eq(target).sum().to(at::kDouble);
  count_ += items;
}

EvalResult EvalSums::Reduce(ddp::ProcessGroup& group, Task task) const {
  at::Tensor sums = torch::stack({loss_, correct_, torch::full({}, count_, loss_.options())});
  group.AllReduce(sums, ddp::ReduceOp::kSum)->Wait();
  sums = sums.cpu();
  EvalResult result;
  const double total = sums[2].item<double>();
  result.loss = total > 0 ? sums[0].item<double>() / total : 0;
  result.metrics["loss"] = result.loss;
  if (task == Task::kClassification && total > 0) {
    result.metrics["accuracy"] = sums[1].item<double>() / total;
  }
  if (task == Task::kLanguageModel) result.metrics["perplexity"] = std::exp(result.loss);
  return result;
}

std::vector<int64_t> EvaluationShare(const std::vector<int64_t>& validation, int shard,
                                     int shards) {
  std::vector<int64_t> mine;
  for (size_t i = static_cast<size_t>(shard); i < validation.size();
       i += static_cast<size_t>(shards)) {
    mine.push_back(validation[i]);
  }
  return mine;
}

EvalResult Evaluate(models::Model& model, const data::Dataset& dataset,
                    const std::vector<int64_t>& validation, const TrainingPlan& plan,
                    ddp::ProcessGroup& group, const c10::Device& device) {
  const std::vector<int64_t> mine = EvaluationShare(validation, plan.rank, plan.world_size);
  model.module()->eval();
  const EvalSums local = SumBatches(model, dataset, mine, plan, device);
  model.module()->train();
  return local.Reduce(group, dataset.shape().task);
}

}  // namespace gradhub::trainer
