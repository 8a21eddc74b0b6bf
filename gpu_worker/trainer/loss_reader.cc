#include "gpu_worker/trainer/loss_reader.h"

#include <torch/torch.h>

#include <cmath>
#include <string>

#include "gpu_worker/trainer/errors.h"

namespace gradhub::trainer {

void LossReader::Take(const at::Tensor& step_loss) {
  unread_sum_ = unread_steps_ == 0 ? step_loss : unread_sum_ + step_loss;
  last_unread_ = step_loss;
  ++unread_steps_;
}

double LossReader::Read(int64_t last) {
  if (unread_steps_ == 0) return 0;
  double sum = 0;
  if (unread_steps_ == 1) {
    sum = last_loss_ = unread_sum_.item<double>();
  } else {
    const at::Tensor both = torch::stack({unread_sum_, last_unread_}).cpu();
    sum = both[0].item<double>();
    last_loss_ = both[1].item<double>();
  }
  const int64_t first = last + 1 - unread_steps_;
  unread_steps_ = 0;
  if (!std::isfinite(sum)) {
    throw TrainingFailure(
        "loss is " + std::to_string(sum) +
        (first == last ? " at step " + std::to_string(last)
                       : " in steps " + std::to_string(first) + " to " + std::to_string(last)) +
        " on rank " + std::to_string(rank_));
  }
  return sum;
}

}  // namespace gradhub::trainer
