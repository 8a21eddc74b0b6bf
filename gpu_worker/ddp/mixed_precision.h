// Mixed precision for a training step: autocast for the forward and the loss, and dynamic loss
// scaling for float16 gradients (torch.autocast and torch.cuda.amp.GradScaler).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <vector>

namespace gradhub::ddp {

// Runs the code in its scope under autocast: matmuls and convolutions on `device` run in
// `dtype` (bfloat16 on CPU, float16 or bfloat16 on CUDA) while the parameters, which the
// optimizer updates, stay float32 (torch.autocast(device_type, dtype)). Ops that need range
// (losses, softmax, norms) stay float32 by autocast's own lists.
//
// On construction: remember whether autocast was on and its dtype for `device`, turn it on
// with `dtype`, and enter one nesting level. On destruction: leave the level; the outermost
// level clears the cache of low-precision copies of the weights (they change at every
// optimizer step); then restore what was remembered. Autocast state is thread-local: the
// guard affects only the thread that made it, and must be destroyed on that thread.
// Backward needs no guard: the casts are recorded in the autograd graph.
class AutocastGuard {
 public:
  // Throws std::invalid_argument for a device other than CPU or CUDA, or CPU with float16
  // (libtorch 1.13's CPU autocast supports bfloat16 only).
  AutocastGuard(c10::DeviceType device, at::ScalarType dtype);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  c10::DeviceType device_;
  bool was_enabled_;
  at::ScalarType previous_dtype_;
};

struct LossScalerOptions {
  // torch.cuda.amp.GradScaler's defaults.
  double init_scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
};

// Dynamic loss scaling for float16 training (torch.cuda.amp.GradScaler): float16 gradients of
// small magnitude underflow to zero, so the loss is multiplied by a large scale before backward
// and the gradients divided by it before anything reads them. A scale too large overflows
// some gradient to inf; that step is skipped and the scale backs off. One step:
//   1. backward of Scale(loss)                 (gradients are scale times too large)
//   2. found_inf = Unscale(parameters)         (before clipping: clipping needs true norms)
//   3. clip, then the optimizer step unless found_inf (a skipped step, counted)
//   4. Update(found_inf): found_inf multiplies the scale by backoff_factor and restarts the
//      count; otherwise after growth_interval clean steps in a row the scale grows by
//      growth_factor.
// In DDP the gradients are averaged before step 2, and an inf or NaN on any rank makes the
// average non-finite on every rank, so every rank skips the same steps without talking.
// The scale is kept in float32 as GradScaler keeps it, and unscaling multiplies by the
// float32 of its double reciprocal, as GradScaler does.
// Not thread-safe.
class LossScaler {
 public:
  struct State {
    double scale = 0;
    int64_t growth_tracker = 0;  // clean steps in a row since the last change
    int64_t skipped_steps = 0;
  };

  explicit LossScaler(LossScalerOptions options = {});

  at::Tensor Scale(const at::Tensor& loss) const;
  // Divides every defined gradient of `parameters` by the scale in place. Returns true when
  // any of them holds an inf or NaN (after which the gradients are garbage: skip the step).
  bool Unscale(const std::vector<at::Tensor>& parameters) const;
  void Update(bool found_inf);

  double scale() const { return state_.scale; }
  int64_t skipped_steps() const { return state_.skipped_steps; }
  // For checkpoints: what resume needs to continue bit for bit.
  const State& state() const { return state_; }
  void set_state(const State& state) { state_ = state; }

 private:
  LossScalerOptions options_;
  State state_;
};

}  // namespace gradhub::ddp
