#include "gpu_worker/data/batch_loader.h"

#include <algorithm>
#include <stdexcept>

namespace gradhub::data {

BatchLoader::BatchLoader(const Dataset& dataset, std::vector<int64_t> indices, int64_t batch_size,
                         bool drop_last, int prefetch, int64_t start_batch, bool pin_memory)
    : dataset_(dataset),
      indices_(std::move(indices)),
      batch_size_(batch_size),
      num_batches_(batch_size <= 0 ? 0
                   : drop_last
                       ? static_cast<int64_t>(indices_.size()) / batch_size
                       : (static_cast<int64_t>(indices_.size()) + batch_size - 1) / batch_size),
      prefetch_(std::max(1, prefetch)),
      next_to_build_(std::max<int64_t>(0, start_batch)),
      pin_memory_(pin_memory),
      thread_([this] { Produce(); }) {
  if (batch_size <= 0) throw std::invalid_argument("BatchLoader: batch size must be positive");
}

BatchLoader::~BatchLoader() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

void BatchLoader::Produce() {
  try {
    while (true) {
      int64_t batch;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        changed_.wait(lock, [&] { return stopping_ || ready_.size() < prefetch_; });
        if (stopping_ || next_to_build_ >= num_batches_) break;
        batch = next_to_build_++;
      }
      const auto begin = indices_.begin() + batch * batch_size_;
      const auto end = indices_.begin() + std::min<int64_t>(static_cast<int64_t>(indices_.size()),
                                                            (batch + 1) * batch_size_);
      at::Tensor x, y;
      dataset_.Batch(std::vector<int64_t>(begin, end), &x, &y);
      if (pin_memory_) {
        x = x.pin_memory();
        y = y.pin_memory();
      }
      {
        std::lock_guard<std::mutex> lock(mutex_);
        ready_.emplace_back(std::move(x), std::move(y));
      }
      changed_.notify_all();
    }
  } catch (...) {
    std::lock_guard<std::mutex> lock(mutex_);
    error_ = std::current_exception();
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    done_ = true;
  }
  changed_.notify_all();
}

bool BatchLoader::Next(at::Tensor* x, at::Tensor* y) {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [&] { return !ready_.empty() || done_; });
  if (ready_.empty()) {
    if (error_) std::rethrow_exception(error_);
    return false;
  }
  *x = std::move(ready_.front().first);
  *y = std::move(ready_.front().second);
  ready_.pop_front();
  lock.unlock();
  changed_.notify_all();
  return true;
}

}  // namespace gradhub::data
