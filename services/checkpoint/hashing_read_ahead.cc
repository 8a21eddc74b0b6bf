#include "services/checkpoint/hashing_read_ahead.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace gradhub::checkpoint {

bool ReadAheadQueue::Push(std::string chunk, std::optional<BlobDigests> digests) {
  std::unique_lock<std::mutex> lock(mu_);
  changed_.wait(lock, [&] { return stopped_ || queued_bytes_ < max_queued_bytes_; });
  if (stopped_) return false;
  if (digests.has_value()) digests_ = std::move(digests);
  queued_bytes_ += chunk.size();
  chunks_.push_back(std::move(chunk));
  changed_.notify_all();
  return true;
}

void ReadAheadQueue::SetDigests(BlobDigests digests) {
  std::lock_guard<std::mutex> lock(mu_);
  digests_ = std::move(digests);
  changed_.notify_all();
}

void ReadAheadQueue::Close(absl::Status status) {
  std::lock_guard<std::mutex> lock(mu_);
  error_ = std::move(status);
  closed_ = true;
  changed_.notify_all();
}

void ReadAheadQueue::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopped_ = true;
  }
  changed_.notify_all();
}

bool ReadAheadQueue::stopped() {
  std::lock_guard<std::mutex> lock(mu_);
  return stopped_;
}

absl::Status ReadAheadQueue::Pop(std::string* data) {
  data->clear();
  std::unique_lock<std::mutex> lock(mu_);
  changed_.wait(lock, [&] { return !chunks_.empty() || closed_; });
  if (chunks_.empty()) return error_;
  *data = std::move(chunks_.front());
  chunks_.pop_front();
  queued_bytes_ -= data->size();
  changed_.notify_all();
  return absl::OkStatus();
}

std::optional<BlobDigests> ReadAheadQueue::Digests() {
  std::unique_lock<std::mutex> lock(mu_);
  changed_.wait(lock, [&] { return digests_.has_value() || closed_; });
  return digests_;
}

HashingReadAhead::HashingReadAhead(std::unique_ptr<BlobReader> reader, int64_t size,
                                   size_t chunk_bytes, ReadAheadOptions options)
    : reader_(std::move(reader)),
      size_(size),
      chunk_bytes_(chunk_bytes),
      digester_(options.sha256),
      queue_(options.max_queued_bytes),
      hasher_(2 * chunk_bytes),
      thread_([this] { ReadAll(); }) {}

HashingReadAhead::~HashingReadAhead() {
  queue_.Stop();
  thread_.join();
}

void HashingReadAhead::ReadAll() {
  if (size_ == 0) queue_.SetDigests(digester_.Digests());  // an empty blob: known at once
  int64_t read = 0;
  absl::Status failed;
  while (read < size_ && !queue_.stopped()) {
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
  queue_.Close(failed);
}

void HashingReadAhead::HashAndQueue(std::string chunk, bool last) {
  // Step 2, outside the queue's lock: the consumer takes chunks meanwhile.
  digester_.Update(chunk);
  // Step 3: the digests go in with the last chunk.
  queue_.Push(std::move(chunk),
              last ? std::optional<BlobDigests>(digester_.Digests()) : std::nullopt);
}

}  // namespace gradhub::checkpoint
