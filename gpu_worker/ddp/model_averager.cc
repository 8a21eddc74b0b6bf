#include "gpu_worker/ddp/model_averager.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <map>
#include <stdexcept>

namespace gradhub::ddp {

PeriodicModelAverager::PeriodicModelAverager(std::vector<at::Tensor> parameters,
                                             std::shared_ptr<ProcessGroup> group,
                                             LocalSgdOptions options)
    : parameters_(std::move(parameters)), group_(std::move(group)), options_(options) {
  if (options_.period < 1 || options_.warmup_steps < 0) {
    throw std::invalid_argument("PeriodicModelAverager: period must be >= 1, warmup >= 0");
  }
}

bool PeriodicModelAverager::Synchronous(int64_t step) const {
  return options_.period == 1 || step < options_.warmup_steps;
}

bool PeriodicModelAverager::AveragesAfter(int64_t step) const {
  return !Synchronous(step) && (step - options_.warmup_steps + 1) % options_.period == 0;
}

int64_t PeriodicModelAverager::AfterStep(int64_t step) {
  if (!AveragesAfter(step) || group_->size() == 1) return 0;
  std::map<at::ScalarType, std::vector<at::Tensor>> by_type;
  for (const at::Tensor& parameter : parameters_) {
    by_type[parameter.scalar_type()].push_back(parameter.detach().reshape({-1}));
  }
  c10::NoGradGuard no_grad;
  int64_t bytes = 0;
  for (auto& [type, flat_parts] : by_type) {
    at::Tensor flat = at::cat(flat_parts);
    group_->AllReduce(flat, ReduceOp::kAverage)->Wait();
    bytes += flat.nbytes();
    int64_t offset = 0;
    for (at::Tensor& part : flat_parts) {
      part.copy_(flat.narrow(0, offset, part.numel()));
      offset += part.numel();
    }
  }
  return bytes;
}

}  // namespace gradhub::ddp
