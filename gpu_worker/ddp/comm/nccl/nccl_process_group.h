// Compiled only when GRADHUB_HAVE_NCCL (CUDA runtime and nccl.h found); runs only where a
// GPU is visible.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gpu_worker/ddp/comm/process_group.h"

namespace gradhub::ddp {

// ProcessGroup on NCCL, for CUDA tensors on one device per rank (c10d's ProcessGroupNCCL).
//
// Protocol:
//  1. Rank 0 creates an ncclUniqueId and Sets it under `options.name + "/nccl-id"`; the others
//     Get it (options.timeout). Group names must be unique per store (no stale id).
//  2. Every rank initialises one communicator on options.device (nonblocking init where NCCL
//     >= 2.14, so a peer that never arrives fails the constructor after options.timeout
//     instead of hanging) and creates its own CUDA stream (non-blocking).
//  3. Each collective: record an event on the caller's compute stream (CurrentComputeStream)
//     and make the NCCL stream wait on it, so the kernels that produced the inputs finish
//     first; enqueue the NCCL call on the NCCL stream; record an end event there. The Work is
//     marked started at enqueue time.
//  4. A watchdog thread polls the oldest end event (cudaEventQuery) and the communicator's
//     async error (ncclCommGetAsyncError). A completed event completes its Work: the results
//     are then in device memory for any stream. An async error, a CUDA error, or an op still
//     running options.timeout after it was enqueued aborts the communicator (ncclCommAbort,
//     which also ends the kernels waiting for a dead peer) and fails that Work and every
//     later one with CommError naming op, group and rank; the group is unusable afterwards.
//
// Tensors are kept referenced until their Work completed. Collectives run in issue order on
// the one stream. kAverage uses ncclAvg (NCCL >= 2.10 at build and run time; older NCCL
// rejects it with std::invalid_argument). Barrier is a sum allreduce of one float on the
// NCCL stream, so it completes after every earlier collective of this rank.
//
// Thread-safety: collectives may be issued from any thread (serialised, in issue order).
// Destruction waits for outstanding collectives (each bounded by options.timeout), then
// finalises the communicator, or aborts it when the group is broken.
class NcclProcessGroup final : public ProcessGroup {
 public:
  // Throws CommError when no GPU is visible, options.device does not exist, the store or
  // the communicator initialisation fails or times out.
  explicit NcclProcessGroup(const ProcessGroupOptions& options);
  ~NcclProcessGroup() override;

  std::shared_ptr<Work> Broadcast(std::vector<at::Tensor> tensors, int root) override;
  std::shared_ptr<Work> AllReduce(at::Tensor tensor, ReduceOp op = ReduceOp::kSum) override;
  std::shared_ptr<Work> AllGather(std::vector<at::Tensor> outputs, at::Tensor input) override;
  std::shared_ptr<Work> Barrier() override;

  int device() const { return device_; }

 private:
  struct Pending {
    std::shared_ptr<Work> work;
    cudaEvent_t done = nullptr;
    std::chrono::steady_clock::time_point deadline;
    std::vector<at::Tensor> keep_alive;
  };

  // Step 3 under mu_: fails fast when broken, completes at once when `empty`, else calls
  // `enqueue` (which issues NCCL calls on stream_) between the two events.
  template <typename Enqueue>
  std::shared_ptr<Work> Launch(const char* kind, const std::string& detail, bool empty,
                               std::vector<at::Tensor> keep_alive, Enqueue&& enqueue);
  // For a nonblocking communicator: polls ncclCommGetAsyncError until the last call is no
  // longer in progress; CommError on error or past `deadline`. Caller holds mu_.
  void AwaitIssued(const char* what, std::chrono::steady_clock::time_point deadline);
  void WatchdogLoop();
  // Aborts the communicator (once) and fails every pending Work; the first gets `reason`.
  // Caller holds mu_; returns the Works to complete (outside the lock) with their errors.
  std::vector<std::pair<std::shared_ptr<Work>, std::exception_ptr>> AbortLocked(
      const std::string& reason);
  std::exception_ptr UnusableErrorLocked(const std::string& description) const;
  cudaEvent_t TakeEventLocked();
  void ReturnEventLocked(cudaEvent_t event);
  std::string Describe(const char* kind, uint64_t seq, const std::string& detail) const;

  const std::chrono::milliseconds timeout_;
  const int device_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  float* barrier_buffer_ = nullptr;  // one float on the device
  int nccl_version_ = 0;

  std::mutex mu_;  // everything below, and every NCCL call on comm_
  std::condition_variable wake_;
  uint64_t next_seq_ = 0;
  std::deque<Pending> pending_;
  std::vector<cudaEvent_t> free_events_;
  bool stopping_ = false;
  bool aborted_ = false;
  std::string broken_reason_;  // empty while healthy
  std::thread watchdog_;
};

}  // namespace gradhub::ddp
