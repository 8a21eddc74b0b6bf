// The trainer's failures that are not the job's input (UserError, contract/user_error.h): each
// ends the rank with its own exit code (contract/trainer_exit_codes.h, main.cc).
#pragma once

#include <stdexcept>

namespace gradhub::trainer {

// The loss became NaN or infinite (a job failure: bad learning rate, bad data).
class TrainingFailure : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The trainer was asked to stop (SIGTERM: preemption, drain, cancel) and did: rank 0 saved a
// checkpoint of the last finished step first, when it had a sink and the grace allowed.
class Preempted : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The node said this rank has a GPU (GRADHUB_DEVICE=cuda) but this process can use none:
// libtorch without CUDA, or no device visible. The node's fault, not the job's.
class DeviceUnavailable : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace gradhub::trainer
