#include "gpu_worker/trainer/optimization.h"

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <cmath>

namespace gradhub::trainer {
namespace {

double BaseLearningRate(const v1::OptimizerSpec& spec) {
  switch (spec.kind_case()) {
    case v1::OptimizerSpec::kSgd:
      return spec.sgd().lr();
    case v1::OptimizerSpec::kAdam:
      return spec.adam().lr();
    case v1::OptimizerSpec::kAdamw:
      return spec.adamw().lr();
    case v1::OptimizerSpec::KIND_NOT_SET:
      break;
  }
  return 0;
}

template <typename Options, typename Spec>
Options AdamOptions(const Spec& spec, double default_weight_decay) {
  Options options(spec.lr());
  options.betas({spec.has_beta1() ? spec.beta1() : 0.9, spec.has_beta2() ? spec.beta2() : 0.999});
  options.eps(spec.has_eps() ? spec.eps() : 1e-8);
  options.weight_decay(spec.has_weight_decay() ? spec.weight_decay() : default_weight_decay);
  options.amsgrad(spec.amsgrad());
  return options;
}

}  // namespace

std::unique_ptr<torch::optim::Optimizer> BuildOptimizer(const v1::OptimizerSpec& spec,
                                                        std::vector<at::Tensor> parameters) {
  switch (spec.kind_case()) {
    case v1::OptimizerSpec::kSgd: {
      const auto& sgd = spec.sgd();
      return std::make_unique<torch::optim::SGD>(parameters, torch::optim::SGDOptions(sgd.lr())
                                                                 .momentum(sgd.momentum())
                                                                 .dampening(sgd.dampening())
                                                                 .weight_decay(sgd.weight_decay())
                                                                 .nesterov(sgd.nesterov()));
    }
    case v1::OptimizerSpec::kAdam:
      return std::make_unique<torch::optim::Adam>(
          parameters, AdamOptions<torch::optim::AdamOptions>(spec.adam(), 0.0));
    case v1::OptimizerSpec::kAdamw:
      return std::make_unique<torch::optim::AdamW>(
          parameters, AdamOptions<torch::optim::AdamWOptions>(spec.adamw(), 0.01));
    case v1::OptimizerSpec::KIND_NOT_SET:
      break;
  }
  throw std::invalid_argument("optimizer is not set");  // CheckJobSpec refuses this earlier
}

double LearningRateAt(const v1::JobSpec& spec, int64_t step) {
  const double base = BaseLearningRate(spec.optimizer());
  const auto& schedule = spec.lr_schedule();
  double lr = base;
  if (schedule.has_step()) {
    lr = base * std::pow(schedule.step().gamma(), step / schedule.step().step_size());
  } else if (schedule.has_cosine()) {
    const int64_t period =
        schedule.cosine().period_steps() > 0 ? schedule.cosine().period_steps() : spec.max_steps();
    const double min_lr = schedule.cosine().min_lr();
    const double progress = period > 0 ? std::min(1.0, static_cast<double>(step) / period) : 1.0;
    lr = min_lr + (base - min_lr) * 0.5 * (1 + std::cos(M_PI * progress));
  }
  if (step < schedule.warmup_steps()) {
    lr *= static_cast<double>(step + 1) / schedule.warmup_steps();
  }
  return lr;
}

void SetLearningRate(torch::optim::Optimizer& optimizer, double learning_rate) {
  for (auto& group : optimizer.param_groups()) group.options().set_lr(learning_rate);
}

}  // namespace gradhub::trainer
