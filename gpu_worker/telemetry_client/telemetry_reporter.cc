#include "gpu_worker/telemetry_client/telemetry_reporter.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cstddef>
#include <iostream>
#include <stdexcept>

#include "services/common/grpc_credentials.h"

namespace gradhub::telemetry_client {
namespace {

// gRPC's own reconnect backoff (up to 120 s by default) would keep a restarted service waiting
// long after our backoff asked for it; the channel follows ours instead. Keepalive notices a
// service that vanished while the stream was idle; gradhub-metrics allows pings this often.
grpc::ChannelArguments ChannelArgs(const TelemetryReporterOptions& options) {
  grpc::ChannelArguments args;
  const auto ms = [](std::chrono::nanoseconds d) {
    return static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(d).count());
  };
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, ms(options.backoff.initial));
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, ms(options.backoff.initial));
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, ms(options.backoff.max));
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  return args;
}

}  // namespace

int64_t TelemetryReporter::StepQueue::Push(const StepFigures& step) {
  if (capacity_ == 0) return 1;
  if (size_ == capacity_) {  // the new step takes the oldest one's slot
    slots_[head_] = step;
    head_ = Index(1);
    return 1;
  }
  if (size_ == slots_.size()) Grow();
  slots_[Index(size_)] = step;
  ++size_;
  return 0;
}

void TelemetryReporter::StepQueue::Take(size_t n, std::vector<StepFigures>& out) {
  out.clear();
  for (n = std::min(n, size_); n > 0; --n) {
    out.push_back(std::move(slots_[head_]));
    head_ = Index(1);
    --size_;
  }
}

int64_t TelemetryReporter::StepQueue::PutBack(std::vector<StepFigures>& steps) {
  // Newest first, so that when the ring is full the oldest are the ones left out.
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    if (size_ == capacity_) return static_cast<int64_t>(steps.rend() - it);
    if (size_ == slots_.size()) Grow();
    head_ = Index(slots_.size() - 1);
    slots_[head_] = std::move(*it);
    ++size_;
  }
  return 0;
}

int64_t TelemetryReporter::StepQueue::Clear() {
  const auto held = static_cast<int64_t>(size_);
  head_ = 0;
  size_ = 0;
  return held;
}

// Doubling (from 64): the ring reaches a full queue's size in a few steps of growth, and not
// at all while the service keeps up. The steps are first rotated to start at slot 0, so that
// the new slots come after the newest.
void TelemetryReporter::StepQueue::Grow() {
  std::rotate(slots_.begin(), slots_.begin() + static_cast<std::ptrdiff_t>(head_), slots_.end());
  head_ = 0;
  slots_.resize(std::min(capacity_, std::max<size_t>(64, 2 * slots_.size())));
}

TelemetryReporter::TelemetryReporter(TelemetryReporterOptions options)
    : options_(std::move(options)),
      reachability_(options_.backoff),
      queue_(options_.queue_capacity) {
  if (options_.address.empty()) throw std::invalid_argument("telemetry: no metrics server address");
  auto credentials = ClientCredentials(options_.tls_ca_file);
  if (!credentials.ok()) throw std::invalid_argument(std::string(credentials.status().message()));
  stream_.channel =
      grpc::CreateCustomChannel(options_.address, *credentials, ChannelArgs(options_));
  stream_.stub = v1::TelemetryService::NewStub(stream_.channel);
  batch_.set_job(options_.job);  // the same on every batch
  batch_.set_attempt(options_.attempt);
  batch_.set_rank(options_.rank);
  batch_.set_node(options_.node);
  next_send_ = Clock::now() + options_.batch_interval;
  sender_ = std::thread([this] { Run(); });
}

TelemetryReporter::~TelemetryReporter() { Close(Clock::now()); }

// The training thread's side: a copy under the lock, and a wakeup only once a batch is queued
// (after unlocking, so that the sender does not wake into a lock still held).
void TelemetryReporter::Report(const StepFigures& step) noexcept {
  bool batch_ready = false;
  try {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.reported;
    if (life_.closing || life_.refused) {
      ++stats_.dropped;
      return;
    }
    stats_.dropped += queue_.Push(step);
    batch_ready = queue_.size() == options_.batch_steps;
  } catch (...) {  // out of memory: the step is lost, the trainer is not
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.dropped;
  }
  if (batch_ready) wake_.notify_one();
}

TelemetryReporterStats TelemetryReporter::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void TelemetryReporter::Log(const std::string& message) const {
  if (options_.log) {
    options_.log(message);
  } else {
    std::cerr << "gradhub telemetry: " << message << std::endl;
  }
}

bool TelemetryReporter::Close(Clock::time_point deadline) noexcept {
  std::unique_lock<std::mutex> lock(mu_);
  if (life_.closing) {
    done_.wait(lock, [this] { return life_.finished; });
    return life_.closed_result;
  }
  life_.closing = true;
  life_.close_deadline = deadline;
  wake_.notify_all();
  if (!done_.wait_until(lock, deadline, [this] { return life_.finished; })) {
    // The deadline passed mid-stream (a slow or vanished service): cancel, and open no other.
    life_.cancelled = true;
    if (stream_.context != nullptr) stream_.context->TryCancel();
  }
  lock.unlock();
  if (sender_.joinable()) sender_.join();
  lock.lock();
  return life_.closed_result;
}

void TelemetryReporter::Run() {
  while (WaitForWork()) {
    if (stream_.writer == nullptr && !OpenStream()) {
      WaitBeforeRetry();
      continue;
    }
    TakeBatch();
    if (sending_.empty()) continue;
    if (!WriteBatch()) {
      Requeue();
      EndBrokenStream();
      WaitBeforeRetry();
    }
  }
  const bool finished = FinishStream();
  std::lock_guard<std::mutex> lock(mu_);
  life_.closed_result = finished && queue_.empty();
  stats_.dropped += queue_.Clear();
  life_.finished = true;
  done_.notify_all();
}

// Protocol step 1. False when the sender should stop: closing, and nothing left to send or no
// time left to send it; or refused.
bool TelemetryReporter::WaitForWork() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    if (life_.refused) return false;
    const Clock::time_point now = Clock::now();
    if (life_.closing) return !queue_.empty() && now < life_.close_deadline && !life_.cancelled;
    if (queue_.size() >= options_.batch_steps) return true;
    if (now >= next_send_) {
      next_send_ = now + options_.batch_interval;
      if (!queue_.empty()) return true;
    }
    wake_.wait_until(lock, next_send_);
  }
}

// Protocol step 2: a new stream. The stream has no deadline (it lives as long as the
// trainer); Close() cancels it.
bool TelemetryReporter::OpenStream() {
  auto context = std::make_unique<grpc::ClientContext>();
  if (!options_.token.empty()) context->AddMetadata("authorization", "Bearer " + options_.token);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (life_.cancelled) return false;
    stream_.context = std::move(context);
    ++stats_.streams;
  }
  stream_.response.Clear();
  // Fails at once (not wait_for_ready) when the channel cannot connect: the batch stays queued.
  stream_.writer = stream_.stub->ReportTelemetry(stream_.context.get(), &stream_.response);
  return true;
}

void TelemetryReporter::TakeBatch() {
  std::lock_guard<std::mutex> lock(mu_);
  queue_.Take(options_.batch_steps, sending_);
}

// Protocol step 3: the messages are built here, on the sender thread, from sending_.
bool TelemetryReporter::WriteBatch() {
  batch_.mutable_steps()->Clear();
  {
    std::lock_guard<std::mutex> lock(mu_);
    batch_.set_dropped_steps(stats_.dropped);
  }
  for (const StepFigures& step : sending_) FillStepTelemetry(step, batch_.add_steps());
  if (!stream_.writer->Write(batch_)) return false;  // sending_ goes back to the queue
  reachability_.backoff.Reset();
  std::lock_guard<std::mutex> lock(mu_);
  stats_.sent += static_cast<int64_t>(sending_.size());
  if (!reachability_.reachable) {
    reachability_.reachable = true;
    Log(options_.address + ": sending again (" + std::to_string(stats_.dropped) +
        " steps dropped so far)");
  }
  return true;
}

void TelemetryReporter::Requeue() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.dropped += queue_.PutBack(sending_);
  sending_.clear();
}

void TelemetryReporter::EndBrokenStream() {
  const grpc::Status status = stream_.writer->Finish();
  stream_.writer.reset();
  std::lock_guard<std::mutex> lock(mu_);
  stream_.context.reset();
  ++stats_.failures;
  if (!status.ok() && !IsRetryable(status)) {  // protocol step 3: no retry changes this answer
    life_.refused = true;
    Log(options_.address + ": " + status.error_message() + " (code " +
        std::to_string(status.error_code()) + "); not retrying: telemetry of this rank stops");
    return;
  }
  if (reachability_.reachable) {
    reachability_.reachable = false;
    Log(options_.address + ": " + (status.ok() ? "stream ended" : status.error_message()) +
        "; retrying, and dropping the oldest steps beyond " +
        std::to_string(options_.queue_capacity) + " meanwhile");
  }
}

// Protocol step 4's end: half-close, and learn how many steps the server accepted. False when
// the stream did not end cleanly (what was written on it may be lost).
bool TelemetryReporter::FinishStream() {
  if (stream_.writer == nullptr) return true;
  const bool half_closed = stream_.writer->WritesDone();
  const grpc::Status status = stream_.writer->Finish();
  stream_.writer.reset();
  std::lock_guard<std::mutex> lock(mu_);
  stream_.context.reset();
  if (!half_closed || !status.ok()) return false;
  stats_.accepted += stream_.response.accepted_steps();
  return true;
}

// Sleeps the next wait of the backoff (cut short by the first Close(), and never past its
// deadline); not at all once refused.
void TelemetryReporter::WaitBeforeRetry() {
  std::unique_lock<std::mutex> lock(mu_);
  if (life_.refused) return;
  const bool was_closing = life_.closing;
  const auto wait = std::chrono::duration_cast<Clock::duration>(reachability_.backoff.Next());
  const Clock::time_point until = std::min(Clock::now() + wait, life_.close_deadline);
  wake_.wait_until(lock, until, [&] { return life_.closing != was_closing || life_.cancelled; });
}

}  // namespace gradhub::telemetry_client
