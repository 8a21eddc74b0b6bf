#include "services/checkpoint/hashing_read_ahead.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "services/common/crc32c.h"

namespace gradhub::checkpoint {

HashingReadAhead::HashingReadAhead(std::unique_ptr<BlobReader> reader, int64_t size,
                                   size_t chunk_bytes, ReadAheadOptions options)
    : reader_(std::move(reader)),
      size_(size),
      chunk_bytes_(chunk_bytes),
      options_(options),
      hasher_(2 * chunk_bytes),
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
  if (size_ == 0) {
    std::lock_guard<std::mutex> lock(mu_);
    digests_ = BlobDigests{0, options_.sha256 ? sha_.Hex() : ""};
    changed_.notify_all();
  }
  int64_t read = 0;
  absl::Status failed;
  while (read < size_ && !Stopping()) {
    std::string chunk;
    failed =
        reader_->Read(static_cast<size_t>(std::min<int64_t>(chunk_bytes_, size_ - read)), &chunk);
    if (failed.ok() && chunk.empty()) {
      failed = absl::DataLossError(
          absl::StrCat("its blob ended early, at ", read, " of ", size_, " bytes"));
    }
    if (!failed.ok()) break;
    read += static_cast<int64_t>(chunk.size());
    const size_t bytes = chunk.size();
    hasher_.Submit(bytes, [this, chunk = std::move(chunk), last = read == size_]() mutable {
      HashAndQueue(std::move(chunk), last);  // step 1: the next read starts meanwhile
    });
  }
  hasher_.Drain();  // step 4: the chunks before a failure are queued first
  std::lock_guard<std::mutex> lock(mu_);
  error_ = failed;
  done_ = true;
  changed_.notify_all();
}

void HashingReadAhead::HashAndQueue(std::string chunk, bool last) {
  // Step 2, outside the lock: the consumer takes chunks meanwhile.
  crc32c_ = Crc32cExtend(crc32c_, chunk);
  if (options_.sha256) sha_.Update(chunk);
  std::unique_lock<std::mutex> lock(mu_);
  changed_.wait(lock, [&] { return stopping_ || queued_bytes_ < options_.max_queued_bytes; });
  if (stopping_) return;
  if (last) digests_ = BlobDigests{crc32c_, options_.sha256 ? sha_.Hex() : ""};  // step 3
  queued_bytes_ += chunk.size();
  queue_.push_back(std::move(chunk));
  changed_.notify_all();
}

bool HashingReadAhead::Stopping() {
  std::lock_guard<std::mutex> lock(mu_);
  return stopping_;
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

std::optional<BlobDigests> HashingReadAhead::Digests() {
  std::unique_lock<std::mutex> lock(mu_);
  changed_.wait(lock, [&] { return digests_.has_value() || done_; });  // an empty blob: at once
  return digests_;
}

}  // namespace gradhub::checkpoint
