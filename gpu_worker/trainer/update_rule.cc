#include "gpu_worker/trainer/update_rule.h"

#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <stdexcept>

#include "gpu_worker/ddp/powersgd.h"
#include "gpu_worker/trainer/errors.h"
#include "gpu_worker/trainer/optimization.h"

namespace gradhub::trainer {
namespace {

// torch::nn::utils::clip_grad_norm_ returns the total norm as a double, which waits for the
// GPU at every step; this scales the gradients by the same clamp(max_norm / (norm + 1e-6), 1)
// without reading anything back. The CPU keeps torch's.
void ClipGradNormOnDevice(const std::vector<at::Tensor>& parameters, double max_norm) {
  torch::NoGradGuard no_grad;
  std::vector<at::Tensor> norms;
  for (const at::Tensor& p : parameters) {
    if (p.grad().defined()) norms.push_back(p.grad().norm(2));
  }
  if (norms.empty()) return;
  const at::Tensor coefficient =
      torch::clamp_max(max_norm / (torch::stack(norms).norm(2) + 1e-6), 1.0);
  for (const at::Tensor& p : parameters) {
    if (p.grad().defined()) p.grad().mul_(coefficient);
  }
}

// A pipeline's gradients are split over its stages, so the norm that clipping compares with
// max_norm is the whole model's, as clip_grad_norm_ takes it on one process: each rank's
// squared norm, summed over the world group (a collective), divided by the replicas (each
// holds the same averaged gradients of its stage). The gradients are then scaled as above, by
// the same coefficient on every rank.
void ClipGradNormAcrossStages(const std::vector<at::Tensor>& parameters, double max_norm,
                              ddp::ProcessGroup& world, int replicas) {
  torch::NoGradGuard no_grad;
  const c10::Device device = parameters.empty() ? c10::Device(c10::kCPU) : parameters[0].device();
  at::Tensor squared = torch::zeros({}, at::TensorOptions(at::kDouble).device(device));
  for (const at::Tensor& p : parameters) {
    if (p.grad().defined()) squared += p.grad().norm(2).to(at::kDouble).pow(2);
  }
  world.AllReduce(squared, ddp::ReduceOp::kSum)->Wait();
  const at::Tensor norm = (squared / replicas).sqrt();
  const at::Tensor coefficient = torch::clamp_max(max_norm / (norm + 1e-6), 1.0);
  for (const at::Tensor& p : parameters) {
    if (p.grad().defined()) p.grad().mul_(coefficient.to(p.grad().scalar_type()));
  }
}

// The learning rate of step `step` (0-based). Parameters are float32: a larger step size
// cannot be applied, only diverge.
double CheckedLearningRate(const v1::JobSpec& spec, int64_t step) {
  const double lr = LearningRateAt(spec, step);
  if (!(std::abs(lr) <= std::numeric_limits<float>::max())) {
    throw TrainingFailure("learning rate " + std::to_string(lr) + " overflows float32 at step " +
                          std::to_string(step));
  }
  return lr;
}

// The plan's comm hook as the Reducer's (null: plain allreduce); the one place that maps it.
std::shared_ptr<ddp::CommHook> MakeCommHook(const GradientSyncPlan& sync) {
  switch (sync.comm_hook) {
    case v1::DistributedSpec::FP16:
      return std::make_shared<ddp::CastCompressHook>(at::kHalf);
    case v1::DistributedSpec::BF16:
      return std::make_shared<ddp::CastCompressHook>(at::kBFloat16);
    case v1::DistributedSpec::POWER_SGD: {
      const v1::DistributedSpec::PowerSgd& p = sync.power_sgd;
      ddp::PowerSgdOptions powersgd;
      powersgd.matrix_approximation_rank = p.matrix_approximation_rank();
      powersgd.start_iter = p.start_step();
      powersgd.min_compression_rate = p.min_compression_rate();
      powersgd.error_feedback = p.error_feedback();
      powersgd.warm_start = p.warm_start();
      powersgd.seed = sync.seed;
      return std::make_shared<ddp::PowerSgdHook>(powersgd);
    }
    default:
      return nullptr;
  }
}

}  // namespace

UpdateRule::UpdateRule(std::shared_ptr<torch::nn::Module> module,
                       std::shared_ptr<ddp::ProcessGroup> group, const TrainingPlan& plan,
                       ddp::LossScalerOptions loss_scaler)
    : plan_(plan),
      module_(std::move(module)),
      group_(group),
      comm_hook_(MakeCommHook(plan.gradient_sync)) {
  const v1::OptimizerSpec& optimizer = plan_.spec.optimizer();
  if (plan_.update.shard_optimizer_state) {
    zero_ = std::make_unique<ddp::ZeroRedundancyOptimizer>(
        module_->parameters(), group, [&optimizer](std::vector<at::Tensor> parameters) {
          return BuildOptimizer(optimizer, std::move(parameters));
        });
  } else {
    optimizer_ = BuildOptimizer(optimizer, module_->parameters());
  }
  if (const std::optional<LocalSgdPlan>& local = plan_.update.local_sgd) {
    ddp::LocalSgdOptions options;
    options.period = local->period;
    options.warmup_steps = local->warmup_steps;
    averager_ = std::make_unique<ddp::PeriodicModelAverager>(module_->parameters(), group, options);
  }
  if (plan_.update.loss_scaling) scaler_.emplace(loss_scaler);
}

UpdateRule::~UpdateRule() = default;

ddp::DdpOptions UpdateRule::GradientSyncOptions() const {
  const GradientSyncPlan& sync = plan_.gradient_sync;
  ddp::DdpOptions options;
  options.reducer.bucket_cap_bytes = sync.bucket_cap_bytes;
  options.reducer.find_unused_parameters = sync.find_unused_parameters;
  options.reducer.comm_hook = comm_hook_;
  return options;
}

bool UpdateRule::SyncsGradients(int64_t step) const {
  return !averager_ || averager_->Synchronous(step);
}

at::Tensor UpdateRule::LossForBackward(const at::Tensor& loss) const {
  return scaler_ ? scaler_->Scale(loss) : loss;
}

// FP16 unscales before clipping (which needs the true norm), and skips the step when a
// gradient overflowed, as every rank does (mixed_precision.h).
StepOutcome UpdateRule::Step(int64_t step) {
  StepOutcome outcome;
  outcome.learning_rate = CheckedLearningRate(plan_.spec, step);
  if (scaler_) {
    const bool found_inf = scaler_->Unscale(module_->parameters());
    scaler_->Update(found_inf);
    outcome.skipped = found_inf;
  }
  if (!outcome.skipped) {
    ClipGradients();
    SetLearningRate(LocalOptimizer(), outcome.learning_rate);
    if (zero_) {
      zero_->Step();
    } else {
      optimizer_->step();
    }
  }
  if (averager_) outcome.averaged_bytes = averager_->AfterStep(step);
  return outcome;
}

void UpdateRule::ClipGradients() {
  const double max_norm = plan_.update.grad_clip_norm;
  if (max_norm <= 0) return;
  if (plan_.pipeline.enabled()) {
    ClipGradNormAcrossStages(module_->parameters(), max_norm, *group_, plan_.pipeline.replicas);
  } else if (plan_.placement.cuda) {
    ClipGradNormOnDevice(module_->parameters(), max_norm);
  } else {
    torch::nn::utils::clip_grad_norm_(module_->parameters(), max_norm);
  }
}

torch::optim::Optimizer& UpdateRule::LocalOptimizer() const {
  return zero_ ? zero_->local() : *optimizer_;
}

SharedUpdateState UpdateRule::shared_state() {
  SharedUpdateState state;
  state.optimizer = optimizer_.get();  // with ZeRO each rank's shard is in its rank state
  if (scaler_) state.loss_scaler = &*scaler_;
  return state;
}

// What one rank holds that the others lack (checkpoint_state.h RankStateParts).
RankStateParts UpdateRule::RankState() {
  RankStateParts parts;
  if (averager_) {
    parts.module = module_.get();
    parts.optimizer = optimizer_.get();
  }
  if (zero_) parts.optimizer = &zero_->local();
  if (comm_hook_ && comm_hook_->has_state()) parts.comm_hook = comm_hook_.get();
  return parts;
}

std::string UpdateRule::SaveRankState() { return SerializeRankState(RankState()); }

void UpdateRule::RestoreRankState(const std::string& bytes, int64_t step,
                                  const c10::Device& device) {
  if (bytes.empty()) {
    throw std::runtime_error("the checkpoint of step " + std::to_string(step) +
                             " holds no state of rank " + std::to_string(plan_.rank));
  }
  trainer::RestoreRankState(bytes, RankState(), device);
}

std::optional<LossScaleStatus> UpdateRule::loss_scale() const {
  if (!scaler_) return std::nullopt;
  return LossScaleStatus{scaler_->scale(), scaler_->skipped_steps()};
}

int64_t UpdateRule::optimizer_state_bytes() const {
  return ddp::OptimizerStateBytes(LocalOptimizer());
}

}  // namespace gradhub::trainer
