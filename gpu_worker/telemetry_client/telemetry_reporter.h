// A trainer's per-step telemetry to gradhub-metrics (proto/gradhub/v1/telemetry.proto), sent
// so that it never slows a step: Report() only copies the step's plain figures into a ring
// allocated once (no allocation, no protobuf, one uncontended lock, a wakeup only once a batch
// is queued); a thread of the reporter's own builds the messages and sends them.
// gRPC only, no torch, like store_client: the trainer links it beside the engine.
//
// The sender thread, in order:
//   1. Waits until batch_steps steps are queued, batch_interval has passed since the last
//      batch, or Close() was called.
//   2. Without an open ReportTelemetry stream, opens one. When that fails (the service is
//      down, restarting, or refused the token) it waits a backoff (`backoff`, the gRPC clients'
//      policy of services/common/grpc_retry.h), and goes back to 1; meanwhile steps keep
//      queueing, and once queue_capacity are queued each new one pushes out the oldest, which
//      is counted dropped.
//   3. Takes at most batch_steps steps off the queue and writes them as one TelemetryBatch.
//      A failed write puts them back at the head of the queue (the server drops steps it
//      already has, so resending is harmless), ends the stream, and goes to 2's backoff; but
//      when the stream ended with an answer no retry changes (IsRetryable false:
//      PERMISSION_DENIED, INVALID_ARGUMENT, ...), the reporter says so once and stops sending:
//      every step queued or reported after that is counted dropped.
//   4. On Close(deadline): sends what is queued while the deadline allows, half-closes the
//      stream and reads the server's count of accepted steps. At the deadline an unfinished
//      stream is cancelled and what was not sent is counted dropped.
// Every batch carries the count dropped so far (TelemetryBatch.dropped_steps, cumulative), so
// the service exports it as gradhub_telemetry_dropped_total{reason="trainer_queue_full"}.
//
// Thread-safe: Report(), stats() and Close() may be called from any thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gpu_worker/telemetry_client/step_figures.h"
#include "gradhub/v1/telemetry.grpc.pb.h"
#include "services/common/grpc_retry.h"

namespace gradhub::telemetry_client {

struct TelemetryReporterOptions {
  // host:port of gradhub-metrics' gRPC port.
  std::string address;
  // Sent as `authorization: Bearer <token>` when not empty: the rank's job token, which may
  // report only batches of its own job, attempt and rank (or by hand the admin token).
  std::string token;
  // PEM certificates to trust for TLS; empty = plaintext.
  std::string tls_ca_file;
  // Who is reporting: "jobs/<id>", the attempt (>= 1), the rank, "nodes/<name>".
  std::string job;
  int32_t attempt = 1;
  int32_t rank = 0;
  std::string node;
  // Steps held while the service is slow or down; beyond it the oldest are dropped.
  size_t queue_capacity = 4096;
  // A batch goes out when this many steps are queued, or batch_interval after the last one.
  // Each batch wakes the sender and gRPC's threads and costs a write: a few hundred
  // microseconds of CPU on the trainer's cores, so a batch holds a few hundred milliseconds of
  // fast steps (Prometheus scrapes every 15 s: later than that is not seen).
  size_t batch_steps = 128;
  std::chrono::milliseconds batch_interval{1000};
  // Waits between failed streams; the channel's reconnect backoff follows it.
  BackoffPolicy backoff = kGrpcBackoff;
  // Where the reporter says that the service became unreachable and came back (once per
  // change, not per retry). Empty = stderr.
  std::function<void(const std::string&)> log;
};

struct TelemetryReporterStats {
  int64_t reported = 0;  // Report() calls
  int64_t sent = 0;      // steps written to a stream (a broken stream may have lost some)
  int64_t dropped = 0;   // pushed out of a full queue, or unsent at Close()
  int64_t accepted = 0;  // the server's count, from streams that ended cleanly
  int64_t streams = 0;   // streams opened
  int64_t failures = 0;  // failed stream openings and broken streams
};

class TelemetryReporter {
 public:
  // Starts the sender thread. std::invalid_argument for an empty address or an unreadable
  // tls_ca_file: nothing else is checked here, and nothing waits for the service.
  explicit TelemetryReporter(TelemetryReporterOptions options);
  // Close(now): what was not sent by then is dropped.
  ~TelemetryReporter();
  TelemetryReporter(const TelemetryReporter&) = delete;
  TelemetryReporter& operator=(const TelemetryReporter&) = delete;

  // Queues a copy of one step. Never blocks on the network, never throws, and allocates only
  // for eval_metrics (evaluation steps) and while the ring first grows to its size; after
  // Close() the step is counted dropped.
  void Report(const StepFigures& step) noexcept;

  // Flushes and stops (protocol step 4). True when everything still queued was sent and the
  // last stream ended cleanly; what was lost before (drops, a broken stream) is in stats().
  // Later calls return the first call's answer.
  bool Close(std::chrono::steady_clock::time_point deadline) noexcept;

  TelemetryReporterStats stats() const;

 private:
  using Clock = std::chrono::steady_clock;

  // Steps waiting to be sent, oldest first, at most `capacity`: beyond it the oldest are pushed
  // out. A ring of slots reused step after step, so that queueing allocates nothing once it
  // has grown (it grows as steps pile up, up to `capacity`, rather than allocating it all
  // for a service that keeps up). Not thread-safe (the reporter's mu_ guards it).
  class StepQueue {
   public:
    explicit StepQueue(size_t capacity) : capacity_(capacity) {}
    // Appends a copy of `step`; returns how many of the oldest were pushed out for it (0 or 1).
    int64_t Push(const StepFigures& step);
    // Moves at most `n` of the oldest into `out` (cleared first, its capacity kept).
    void Take(size_t n, std::vector<StepFigures>& out);
    // Steps taken and not sent go back to the head, in order; returns how many of the oldest
    // were pushed out for them.
    int64_t PutBack(std::vector<StepFigures>& steps);
    // Empties the queue; returns how many steps it held.
    int64_t Clear();
    size_t size() const { return size_; }
    bool empty() const { return size_ == 0; }

   private:
    // Room for one more step; called only when every slot is taken and size_ < capacity_.
    void Grow();
    size_t Index(size_t offset) const { return (head_ + offset) % slots_.size(); }

    const size_t capacity_;
    std::vector<StepFigures> slots_;
    size_t head_ = 0;  // the oldest step's slot
    size_t size_ = 0;
  };

  // The connection and its ReportTelemetry stream. The sender thread uses them; `context` is
  // also cancelled by Close(), so it is set and reset under mu_.
  struct Stream {
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<v1::TelemetryService::Stub> stub;
    std::unique_ptr<grpc::ClientContext> context;
    std::unique_ptr<grpc::ClientWriter<v1::TelemetryBatch>> writer;  // null: none open
    v1::ReportTelemetryResponse response;
  };

  // The sender thread's view of the service: how long to wait before the next try, and
  // whether it last said the service was reachable (it says so once per change).
  struct Reachability {
    explicit Reachability(const BackoffPolicy& policy) : backoff(policy) {}
    Backoff backoff;
    bool reachable = true;
  };

  // How far the reporter is in its life; guarded by mu_.
  struct Lifecycle {
    bool closing = false;  // Close() was called: send what is queued, then stop
    Clock::time_point close_deadline = Clock::time_point::max();
    bool cancelled = false;      // the close deadline passed: open no stream
    bool refused = false;        // the service gave a final answer (protocol step 3): send no more
    bool finished = false;       // the sender thread is done
    bool closed_result = false;  // what Close() answers, once finished
  };

  void Run();
  bool WaitForWork();
  bool OpenStream();
  bool WriteBatch();
  bool FinishStream();
  void EndBrokenStream();
  void WaitBeforeRetry();
  void Requeue();
  void TakeBatch();
  void Log(const std::string& message) const;

  const TelemetryReporterOptions options_;
  Stream stream_;
  Reachability reachability_;  // sender thread only
  // The sender thread's batch in flight, as figures (put back on a failed write) and as the
  // message; both reused batch after batch (a cleared repeated field keeps its messages).
  std::vector<StepFigures> sending_;
  v1::TelemetryBatch batch_;

  mutable std::mutex mu_;
  std::condition_variable wake_;  // the sender: work, or Close()
  std::condition_variable done_;  // Close(): the sender finished
  StepQueue queue_;
  TelemetryReporterStats stats_;
  Clock::time_point next_send_;
  Lifecycle life_;

  std::thread sender_;  // last: starts once the members above exist
};

}  // namespace gradhub::telemetry_client
