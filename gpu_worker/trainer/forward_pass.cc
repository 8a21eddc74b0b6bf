#include "gpu_worker/trainer/forward_pass.h"

#include <torch/torch.h>

#include <cmath>

#include "gpu_worker/data/batch_loader.h"

namespace gradhub::trainer {
namespace {

// The validation sums of one rank: loss times items, correct predictions, items.
struct EvalSums {
  at::Tensor loss, correct;
  double count = 0;
};

EvalSums SumBatches(models::Model& model, const data::Dataset& dataset,
                    const std::vector<int64_t>& mine, const TrainingPlan& plan,
                    const c10::Device& device) {
  const auto sum_options = at::TensorOptions().dtype(at::kDouble).device(device);
  EvalSums sums{torch::zeros({}, sum_options), torch::zeros({}, sum_options)};
  const Task task = dataset.shape().task;
  torch::NoGradGuard no_grad;
  data::BatchLoader loader(dataset, mine, plan.batches.per_rank, /*drop_last=*/false,
                           /*prefetch=*/2, /*start_batch=*/0, /*pin_memory=*/device.is_cuda());
  at::Tensor x, y;
  while (loader.Next(&x, &y)) {
    x = ToDevice(x, device);
    y = ToDevice(y, device);
    PrecisionScope precision(plan.autocast, device.type());
    at::Tensor output = model.Forward(x);
    const double items = task == Task::kLanguageModel ? static_cast<double>(y.numel())
                                                      : static_cast<double>(y.size(0));
    sums.loss += Loss(task, output, y).to(at::kDouble) * items;
    if (task == Task::kClassification) {
      sums.correct += output.argmax(1).eq(y).sum().to(at::kDouble);
    }
    sums.count += items;
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

EvalResult Evaluate(models::Model& model, const data::Dataset& dataset,
                    const std::vector<int64_t>& validation, const TrainingPlan& plan,
                    ddp::ProcessGroup& group, const c10::Device& device) {
  std::vector<int64_t> mine;
  for (size_t i = plan.rank; i < validation.size(); i += plan.world_size) {
    mine.push_back(validation[i]);
  }
  model.module()->eval();
  const EvalSums local = SumBatches(model, dataset, mine, plan, device);
  model.module()->train();
  at::Tensor sums =
      torch::stack({local.loss, local.correct, torch::full({}, local.count, local.loss.options())});
  group.AllReduce(sums, ddp::ReduceOp::kSum)->Wait();
  sums = sums.cpu();
  EvalResult result;
  const double total = sums[2].item<double>();
  result.loss = total > 0 ? sums[0].item<double>() / total : 0;
  result.metrics["loss"] = result.loss;
  const Task task = dataset.shape().task;
  if (task == Task::kClassification && total > 0) {
    result.metrics["accuracy"] = sums[1].item<double>() / total;
  }
  if (task == Task::kLanguageModel) result.metrics["perplexity"] = std::exp(result.loss);
  return result;
}

}  // namespace gradhub::trainer
