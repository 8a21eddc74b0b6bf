#include "services/checkpoint/hashing_read_ahead.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace gradhub::checkpoint {

HashingReadAhead::HashingReadAhead(std::unique_ptr<BlobReader> reader, int64_t size,
                                   size_t chunk_bytes, size_t max_queued_bytes)
    : reader_(std::move(reader)),
      size_(size),
      chunk_bytes_(chunk_bytes),
      max_queued_bytes_(max_queued_bytes),
      thread_([this] { ReadAll(); }) {}

HashingReadAhead::~HashingReadAhead() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

void HashingReadAhead::ReadAll() {
  int64_t read = 0;
  absl::Status failed;
  if (size_ == 0) {
    std::lock_guard<std::mutex> lock(mu_);
    hex_ = sha_.Hex();
    changed_.notify_all();
  }
  while (read < size_) {
    std::string chunk;
    failed =
        reader_->Read(static_cast<size_t>(std::min<int64_t>(chunk_bytes_, size_ - read)), &chunk);
    if (failed.ok() && chunk.empty()) {
      failed = absl::DataLossError(
          absl::StrCat("its blob ended early, at ", read, " of ", size_, " bytes"));
    }
    if (!failed.ok()) break;
    sha_.Update(chunk);  // step 1, outside the lock: the consumer takes chunks meanwhile
    read += static_cast<int64_t>(chunk.size());
    std::unique_lock<std::mutex> lock(mu_);
    changed_.wait(lock, [&] { return stopping_ || queued_bytes_ < max_queued_bytes_; });
    if (stopping_) return;
    if (read == size_) hex_ = sha_.Hex();  // step 2
    queued_bytes_ += chunk.size();
    queue_.push_back(std::move(chunk));
    changed_.notify_all();
  }
  std::lock_guard<std::mutex> lock(mu_);
  error_ = failed;  // step 3
  done_ = true;
  changed_.notify_all();
}

absl::Status HashingReadAhead::Next(std::string* data) {
  data->clear();
  std::unique_lock<std::mutex> lock(mu_);
  changed_.wait(lock, [&] { return !queue_.empty() || done_; });
  if (queue_.empty()) return error_;
  *data = std::move(queue_.front());
  queue_.pop_front();
  queued_bytes_ -= data->size();
  changed_.notify_all();
  return absl::OkStatus();
}

std::string HashingReadAhead::Sha256Hex() {
  std::unique_lock<std::mutex> lock(mu_);
  changed_.wait(lock, [&] { return !hex_.empty() || done_; });  // an empty blob: at once
  return hex_;
}

}  // namespace gradhub::checkpoint
