#pragma once

#include <ATen/core/Tensor.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "gpu_worker/data/dataset.h"

namespace gradhub::data {

// Cuts `indices` into batches and builds them on a background thread, keeping up to
// `prefetch` batches ready so the training loop never waits on data it could have had.
// Batch contents depend only on the indices, never on timing.
class BatchLoader {
 public:
  // Starts at batch number `start_batch` (a resumed run skips what it already trained on).
  // `pin_memory` (CUDA training only: pinning needs the CUDA runtime): batches are built in
  // page-locked host memory, on the loading thread, so that the trainer's copies to the GPU
  // can be asynchronous (non_blocking) and overlap the step before.
  BatchLoader(const Dataset& dataset, std::vector<int64_t> indices, int64_t batch_size,
              bool drop_last, int prefetch, int64_t start_batch = 0, bool pin_memory = false);
  ~BatchLoader();
  BatchLoader(const BatchLoader&) = delete;
  BatchLoader& operator=(const BatchLoader&) = delete;

  // The next batch; false at the end. Rethrows what the loading thread threw.
  bool Next(at::Tensor* x, at::Tensor* y);

 private:
  void Produce();

  const Dataset& dataset_;
  const std::vector<int64_t> indices_;
  const int64_t batch_size_;
  const int64_t num_batches_;
  const size_t prefetch_;
  int64_t next_to_build_;
  const bool pin_memory_;

  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<std::pair<at::Tensor, at::Tensor>> ready_;
  bool done_ = false;
  bool stopping_ = false;
  std::exception_ptr error_;
  std::thread thread_;  // last: starts after everything it reads is initialized
};

}  // namespace gradhub::data
