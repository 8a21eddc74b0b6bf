#include "gpu_worker/trainer/async_checkpoint_writer.h"

#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <thread>

namespace gradhub::trainer {

namespace {

// Step 3's priorities, for `thread`: SCHED_IDLE, or back to SCHED_OTHER at nice 0. Lowering
// needs no privilege; raising needs RLIMIT_NICE >= 20 (or CAP_SYS_NICE). 0 or the error.
int SetSavePriority(pthread_t thread, bool idle) {
  sched_param parameters{};
  parameters.sched_priority = 0;
  return pthread_setschedparam(thread, idle ? SCHED_IDLE : SCHED_OTHER, &parameters);
}

// Threads a save started inherited its idle priority; gRPC grows its own thread pools from
// whichever thread calls into it, so such a thread would keep serving every channel at idle
// priority for the rest of the run. Puts every other thread of the process that is at
// SCHED_IDLE back to normal (nothing else in the trainer lowers a thread). Called only where
// step 3d found raising allowed.
void RaiseOtherIdleThreads() {
  const pid_t self = gettid();
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/task", error)) {
    const pid_t thread = static_cast<pid_t>(std::atoi(entry.path().filename().c_str()));
    if (thread <= 0 || thread == self || sched_getscheduler(thread) != SCHED_IDLE) continue;
    sched_param parameters{};
    parameters.sched_priority = 0;
    sched_setscheduler(thread, SCHED_OTHER, &parameters);
  }
}

// The writer's answer to step 3d, said in the log when it is no.
bool SavesMayRunIdle(std::ostream& log) {
  if (ThreadsMayLeaveIdlePriority()) return true;
  log << "gradhub-trainer: checkpoints are saved at normal priority: this rank may not raise a "
         "thread back from idle priority (RLIMIT_NICE below 20), which a save that training "
         "waits for needs\n";
  return false;
}

}  // namespace

// Tried, not deduced (RLIMIT_NICE, CAP_SYS_NICE, a container's dropped capabilities, a seccomp
// filter all decide), on a thread of its own: one left at idle priority is no loss.
bool ThreadsMayLeaveIdlePriority() {
  bool may = false;
  std::thread([&may] {
    may = SetSavePriority(pthread_self(), /*idle=*/true) == 0 &&
          SetSavePriority(pthread_self(), /*idle=*/false) == 0;
  }).join();
  return may;
}

AsyncCheckpointWriter::AsyncCheckpointWriter(std::shared_ptr<CheckpointSink> sink,
                                             std::ostream* log)
    : sink_(std::move(sink)),
      log_(log ? *log : std::cerr),
      idle_saves_(SavesMayRunIdle(log_)),
      thread_([this] { Run(); }) {}

AsyncCheckpointWriter::~AsyncCheckpointWriter() {
  {
    std::unique_lock<std::mutex> lock(mutex_);
    HoldInFlightSaveAtNormalPriority();
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
  HoldInFlightSaveAtNormalPriority();
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
  HoldInFlightSaveAtNormalPriority();
  if (!changed_.wait_for(lock, timeout, [&] { return !busy_; })) return std::nullopt;
  return last_;
}

SaveOutcome AsyncCheckpointWriter::last_outcome() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return last_;
}

void AsyncCheckpointWriter::HoldInFlightSaveAtNormalPriority() {
  if (!idle_saves_ || !busy_ || boosted_) return;
  boosted_ = true;  // a save not picked up yet is not lowered (Run)
  const int error = SetSavePriority(thread_.native_handle(), /*idle=*/false);
  if (error != 0) {  // the probe (step 3d) said it would not be
    log_ << "gradhub-trainer: the checkpoint save being waited for stays at idle priority ("
         << std::strerror(error) << ")\n";
  }
}

void AsyncCheckpointWriter::Run() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    changed_.wait(lock, [&] { return stopping_ || pending_.has_value(); });
    if (!pending_) return;  // stopping, nothing left
    Checkpoint checkpoint = std::move(*pending_);
    pending_.reset();
    // Step 3a: idle, unless the training thread already waits for this one (3b).
    if (idle_saves_ && !boosted_) SetSavePriority(pthread_self(), /*idle=*/true);
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
    if (idle_saves_) RaiseOtherIdleThreads();  // step 3c

    lock.lock();
    last_ = outcome;
    busy_ = false;
    boosted_ = false;
    changed_.notify_all();
  }
}

}  // namespace gradhub::trainer
