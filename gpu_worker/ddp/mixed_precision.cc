#include "gpu_worker/ddp/mixed_precision.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>

#include <stdexcept>

namespace gradhub::ddp {

AutocastGuard::AutocastGuard(c10::DeviceType device, at::ScalarType dtype) : device_(device) {
  if (device == c10::DeviceType::CPU) {
    if (dtype != at::kBFloat16) {
      throw std::invalid_argument("autocast on CPU supports bfloat16 only, not " +
                                  std::string(c10::toString(dtype)));
    }
    was_enabled_ = at::autocast::is_cpu_enabled();
    previous_dtype_ = at::autocast::get_autocast_cpu_dtype();
    at::autocast::set_cpu_enabled(true);
    at::autocast::set_autocast_cpu_dtype(dtype);
  } else if (device == c10::DeviceType::CUDA) {
    was_enabled_ = at::autocast::is_enabled();
    previous_dtype_ = at::autocast::get_autocast_gpu_dtype();
    at::autocast::set_enabled(true);
    at::autocast::set_autocast_gpu_dtype(dtype);
  } else {
    throw std::invalid_argument("autocast supports CPU and CUDA, not " +
                                c10::DeviceTypeName(device));
  }
  at::autocast::increment_nesting();
}

AutocastGuard::~AutocastGuard() {
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  if (device_ == c10::DeviceType::CPU) {
    at::autocast::set_cpu_enabled(was_enabled_);
    at::autocast::set_autocast_cpu_dtype(previous_dtype_);
  } else {
    at::autocast::set_enabled(was_enabled_);
    at::autocast::set_autocast_gpu_dtype(previous_dtype_);
  }
}

LossScaler::LossScaler(LossScalerOptions options) : options_(options) {
  if (!(options_.init_scale > 0) || !(options_.growth_factor > 1) ||
      !(options_.backoff_factor > 0 && options_.backoff_factor < 1) ||
      options_.growth_interval < 1) {
    throw std::invalid_argument(
        "LossScaler: needs init_scale > 0, growth_factor > 1, 0 < backoff_factor < 1 and "
        "growth_interval >= 1");
  }
  state_.scale = static_cast<float>(options_.init_scale);
}

at::Tensor LossScaler::Scale(const at::Tensor& loss) const {
  return loss * static_cast<float>(state_.scale);
}

bool LossScaler::Unscale(const std::vector<at::Tensor>& parameters) const {
  const float inverse = static_cast<float>(1.0 / static_cast<float>(state_.scale));
  at::Tensor all_finite;
  for (const at::Tensor& parameter : parameters) {
    at::Tensor grad = parameter.grad();
    if (!grad.defined()) continue;
    at::Tensor finite = at::isfinite(grad).all();
    all_finite = all_finite.defined() ? at::logical_and(all_finite, finite) : finite;
    grad.mul_(inverse);
  }
  // One read of the flag for all gradients: on CUDA each read waits for the device.
  return all_finite.defined() && !all_finite.item<bool>();
}

void LossScaler::Update(bool found_inf) {
  if (found_inf) {
    state_.scale = static_cast<float>(state_.scale * options_.backoff_factor);
    state_.growth_tracker = 0;
    ++state_.skipped_steps;
    return;
  }
  if (++state_.growth_tracker == options_.growth_interval) {
    state_.scale = static_cast<float>(state_.scale * options_.growth_factor);
    state_.growth_tracker = 0;
  }
}

}  // namespace gradhub::ddp
