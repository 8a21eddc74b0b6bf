#include "gpu_worker/trainer/async_checkpoint_writer.h"

#include <pthread.h>
#include <sched.h>

#include <cstring>
#include <iostream>

namespace gradhub::trainer {

AsyncCheckpointWriter::AsyncCheckpointWriter(std::shared_ptr<CheckpointSink> sink,
                                             std::ostream* log)
    : sink_(std::move(sink)), log_(log ? *log : std::cerr), thread_([this] { Run(); }) {}

AsyncCheckpointWriter::~AsyncCheckpointWriter() {
  {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [&] { return !busy_; });
    stopping_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

std::optional<InFlightSave> AsyncCheckpointWriter::in_flight() const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!busy_) return std::nullopt;
  return InFlightSave{last_submitted_step_,
                      std::chrono::duration<double>(Clock::now() - submitted_at_).count()};
}

double AsyncCheckpointWriter::Submit(Checkpoint checkpoint) {
  const auto start = Clock::now();
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [&] { return !busy_; });
  submitted_at_ = Clock::now();
  const double waited = std::chrono::duration<double>(submitted_at_ - start).count();
  last_submitted_step_ = checkpoint.step;
  pending_ = std::move(checkpoint);
  busy_ = true;
  lock.unlock();
  changed_.notify_all();
  return waited;
}

std::optional<SaveOutcome> AsyncCheckpointWriter::Flush(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (!changed_.wait_for(lock, timeout, [&] { return !busy_; })) return std::nullopt;
  return last_;
}

SaveOutcome AsyncCheckpointWriter::last_outcome() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return last_;
}

namespace {

// Step 3's priority. Lowering a thread's own priority needs no privilege; where it fails
// anyway (a seccomp filter), the save runs at normal priority and the log says so.
void RunAtIdlePriority(std::ostream& log) {
  sched_param parameters{};
  parameters.sched_priority = 0;
  const int error = pthread_setschedparam(pthread_self(), SCHED_IDLE, &parameters);
  if (error != 0) {
    log << "gradhub-trainer: checkpoints are saved at normal priority (SCHED_IDLE: "
        << std::strerror(error) << ")\n";
  }
}

}  // namespace

void AsyncCheckpointWriter::Run() {
  RunAtIdlePriority(log_);
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    changed_.wait(lock, [&] { return stopping_ || pending_.has_value(); });
    if (!pending_) return;  // stopping, nothing left
    Checkpoint checkpoint = std::move(*pending_);
    pending_.reset();
    lock.unlock();

    SaveOutcome outcome;
    outcome.step = checkpoint.step;
    const auto start = Clock::now();
    try {
      sink_->Save(checkpoint);
    } catch (const std::exception& error) {
      outcome.error = error.what();
      log_ << "gradhub-trainer: checkpoint of step " << checkpoint.step
           << " was not saved: " << outcome.error << "\n";
    }
    outcome.seconds = std::chrono::duration<double>(Clock::now() - start).count();

    lock.lock();
    last_ = outcome;
    busy_ = false;
    changed_.notify_all();
  }
}

}  // namespace gradhub::trainer
