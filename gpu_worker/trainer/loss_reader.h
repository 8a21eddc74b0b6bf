// Reads the training loss back from the device, only where it is used (training_plan.h
// Cadence::ReadsLossAt): on a GPU each read waits for the queued kernels, so the losses of the
// steps between reads are summed on the device and read together.
// Not thread-safe: the training thread drives it.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace gradhub::trainer {

class LossReader {
 public:
  explicit LossReader(int rank) : rank_(rank) {}

  // The loss of the step being done (float64, on the training device), not read yet.
  void Take(const at::Tensor& step_loss);
  // Reads the losses not yet read (a wait for the GPU), the last of them step `last` (counted
  // from 0, as in the failure message), and returns their sum (0 when none was unread).
  // Throws TrainingFailure if any was not finite, naming the step, or on a GPU the steps
  // since the last read.
  double Read(int64_t last);
  // The loss of the last step read.
  double last() const { return last_loss_; }

 private:
  const int rank_;
  at::Tensor unread_sum_, last_unread_;
  int64_t unread_steps_ = 0;
  double last_loss_ = 0;
};

}  // namespace gradhub::trainer
