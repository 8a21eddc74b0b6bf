#include "gpu_worker/trainer/data_parallel_pass.h"

#include <torch/torch.h>

#include <optional>
#include <stdexcept>

namespace gradhub::trainer {
namespace {

double Seconds(std::chrono::nanoseconds duration) {
  return std::chrono::duration<double>(duration).count();
}

}  // namespace

DataParallelPass::DataParallelPass(const PassContext& context)
    : context_(context),
      ddp_(context.model.module, context.world, context.rule.GradientSyncOptions()) {}

// The micro-batches (all but the last under NoSync). The backward is of the update rule's
// loss (FP16: scaled), while the loss returned is the true one: its NaN check fails the run
// only for a non-finite loss, not for the overflowed gradients of a skipped step.
at::Tensor DataParallelPass::Run(data::BatchLoader& loader, bool sync, StepReport& report) {
  const TrainingPlan& plan = context_.plan;
  const int64_t accumulation = plan.batches.accumulation;
  models::Model& model = *context_.model.pieces.front();
  at::Tensor step_loss, x, y;
  for (int64_t micro = 0; micro < accumulation; ++micro) {
    if (!loader.Next(&x, &y)) throw std::logic_error("data loader ended before the epoch");
    x = ToDevice(x, context_.device);
    y = ToDevice(y, context_.device);
    std::optional<ddp::DistributedDataParallel::NoSyncGuard> no_sync;
    if (!sync || micro + 1 < accumulation) no_sync.emplace(&ddp_);
    at::Tensor loss = ddp_.Forward([&] {
      PrecisionScope precision(plan.autocast, context_.device.type());
      return Loss(context_.dataset.shape().task, model.Forward(x), y);
    });
    ddp_.Backward(context_.rule.LossForBackward(loss / accumulation));
    const at::Tensor part = loss.detach().to(at::kDouble) / accumulation;
    step_loss = micro == 0 ? part : step_loss + part;
    report.forward_seconds += Seconds(ddp_.last_timings().forward);
    report.backward_seconds += Seconds(ddp_.last_timings().backward);
    report.allreduce_wait_seconds += Seconds(ddp_.last_timings().allreduce_wait);
  }
  const ddp::ReductionStats& reduction = ddp_.last_reduction();
  report.allreduce_bytes += sync ? reduction.bytes : 0;
  report.allreduce_seconds += sync ? Seconds(reduction.allreduce) : 0;
  report.buckets = reduction.buckets;
  return step_loss;
}

EvalResult DataParallelPass::Evaluate(const std::vector<int64_t>& validation) {
  return trainer::Evaluate(*context_.model.pieces.front(), context_.dataset, validation,
                           context_.plan, *context_.world, context_.device);
}

}  // namespace gradhub::trainer
