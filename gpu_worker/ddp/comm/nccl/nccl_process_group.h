// Compiled only when GRADHUB_HAVE_NCCL (CUDA runtime and nccl.h found); runs only where a
// GPU is visible.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "gpu_worker/ddp/comm/collective_checks.h"
#include "gpu_worker/ddp/comm/group_health.h"
#include "gpu_worker/ddp/comm/process_group.h"

namespace gradhub::ddp {

// ProcessGroup on NCCL, for CUDA tensors on one device per rank (c10d's ProcessGroupNCCL).
//
// Protocol:
//  1. Rank 0 creates an ncclUniqueId and Sets it under `options.name + "/nccl-id"`; the others
//     Get it (options.timeout). Group names must be unique per store (no stale id).
//  2. Every rank initialises one communicator on NcclOptions::device (nonblocking init where NCCL
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
// Point to point: Send and Recv are ncclSend / ncclRecv, enqueued by step 3 like a collective
// (after the compute stream, on the one NCCL stream, completed by the watchdog), numbered
// "send #k" / "recv #k" per peer and tag. What differs from Gloo:
//  - NCCL has no tags: the k-th Send from S to R matches R's k-th Recv from S, whatever their
//    tags. Tags are not checked at all (not even in debug builds): checking needs a message
//    of its own, and the callers (the pipeline) issue both sides from one schedule.
//  - The payload's size is not sent either: a size mismatch is not detected here; NCCL's
//    behaviour is then undefined (it may hang until the timeout aborts the communicator).
//  - Every op of a rank, collectives and transfers alike, runs in issue order on one
//    stream, and an ncclSend may not complete before its peer's ncclRecv has started. So a
//    rank must post its transfers in an order its peers match: a ring of Sends each posted
//    before its Recv can deadlock (until the timeout).
//
// How the pipeline (ddp/pipeline) orders its transfers on this group. Not by even and odd
// stage, as Megatron-LM pairs its blocking sends and receives, but by one rule per pair of
// neighbours: both issue the transfers between them in the same order.
//  1. Activations: stage s sends them in its schedule's forward order, the order stage s + 1
//     receives them in (each as a shape header, then the values).
//  2. Gradients coming back: stage s posts each receive at the place in its own list where
//     stage s + 1 sends it, that is, just before sending the activation of the micro-batch
//     that follows it in s + 1's list (GradientReceivesAhead in pipeline/schedule.h, posted
//     by PipelineStage's forward); a gradient s + 1 sends after its last forward is received
//     when s's backward of it runs, which is in the same order.
//  3. The step's loss, from the last stage to stage 0 (the one message between ranks that are
//     not neighbours): sent after the last stage's transfers of the step completed (it waits
//     for its sends), received after stage 0's.
// Why that cannot deadlock: a rank that is stuck has a first unfinished op on its stream,
// and with only the world group's ops there that op is a transfer with a neighbour. Two
// neighbours go through the transfers between them in their common order, and a transfer
// completes once both ends reach it (a small send may end sooner, into the peer's buffer,
// which only helps); so when both first unfinished ops are with each other they are the
// same transfer, seen from its two ends, and it completes. Otherwise follow each rank's
// first op to the neighbour it waits for: in a chain of stages that walk has to turn back
// at stage 0 or the last stage, so some pair waits on each other, and that pair makes
// progress. The loss message closes
// no cycle, as both ends post it with nothing earlier left unfinished. Evaluation (forwards
// only, in batch order) and checkpoint transfers (rank 0 and one rank at a time, each waited
// for) run between steps. pipeline_schedule_test simulates this on one stream per rank for
// GPipe and 1F1B, S 1..8, M 1..16; nccl_pipeline_test runs it on two GPUs (S = 2, D = 1).
// The interleaved schedule sends around the replica's ring, derives no such order, and is
// refused on NCCL (PlanPipeline, the spec's rules).
//
// Open risk, never run on a GPU: S stages x D > 1 replicas on NCCL. Each stage's replicas
// average their gradients through a DistributedDataParallel on the stage's subgroup, a
// second NcclProcessGroup (its own communicator and stream) beside this world group. Its
// bucket allreduces start during the stage's last backward of the step, while that
// backward's gradient send to the previous stage, and the neighbours' transfers, may still
// be in flight on the world group's stream; with a model that has buffers (BatchNorm, a
// TorchScript model's), so does the buffers' broadcast before every micro-batch's forward.
// The order argument above covers one communicator only; NCCL documents concurrent
// operations on several communicators of one device as able to deadlock (their kernels wait
// for peers and need not all be resident at once) unless every rank issues them in one
// order. Were it to hang, the timeout (step 4) would abort the communicator and the rank
// would exit as for a dead peer; a restart could meet the same. nccl_pipeline_test covers
// D = 1 only; S x D ran on Gloo alone (pipeline_e2e_test), whose transfers and collectives
// do not share a stream.
//
// Thread-safety: collectives may be issued from any thread (serialised, in issue order).
// Destruction waits for outstanding collectives (each bounded by options.timeout), then
// finalises the communicator, or aborts it when the group is broken.
class NcclProcessGroup final : public ProcessGroup {
 public:
  // Throws CommError when no GPU is visible, options.nccl->device does not exist, the store
  // or the communicator initialisation fails or times out; std::invalid_argument for options
  // ValidateProcessGroupOptions refuses (options.nccl unset means NcclOptions{}).
  explicit NcclProcessGroup(const ProcessGroupOptions& options);
  ~NcclProcessGroup() override;

  std::shared_ptr<Work> Broadcast(std::vector<at::Tensor> tensors, int root) override;
  std::shared_ptr<Work> AllReduce(at::Tensor tensor, ReduceOp op = ReduceOp::kSum) override;
  std::shared_ptr<Work> AllGather(std::vector<at::Tensor> outputs, at::Tensor input) override;
  std::shared_ptr<Work> Barrier() override;
  std::shared_ptr<Work> Send(at::Tensor tensor, int dst, uint32_t tag) override;
  std::shared_ptr<Work> Recv(at::Tensor tensor, int src, uint32_t tag) override;

  int device() const { return device_; }

 private:
  struct Pending {
    std::shared_ptr<Work> work;
    cudaEvent_t done = nullptr;
    std::chrono::steady_clock::time_point deadline;
    std::vector<at::Tensor> keep_alive;
  };

  // What construction creates (step 2) and destruction frees.
  struct Handles {
    ncclComm_t comm = nullptr;
    cudaStream_t stream = nullptr;
    float* barrier_buffer = nullptr;  // one float on the device
    int nccl_version = 0;
  };

  // Steps 1 and 2, for the constructor; frees what it made and throws CommError on failure.
  void InitCommunicator(const ProcessGroupOptions& options);
  // A transfer's counter: (sending, peer, tag).
  using TransferKey = std::tuple<bool, int, uint32_t>;

  // Step 3 under mu_: fails fast when broken, completes at once when `empty`, else calls
  // `enqueue` (which issues NCCL calls on handles_.stream) between the two events. The Work
  // is numbered by the collectives' sequence, or for a transfer by its key's counter.
  template <typename Enqueue>
  std::shared_ptr<Work> Launch(const char* kind, const detail::CheckedCollective& checked,
                               std::vector<at::Tensor> keep_alive, Enqueue&& enqueue,
                               const TransferKey* transfer = nullptr);
  std::shared_ptr<Work> Transfer(bool sending, at::Tensor tensor, int peer, uint32_t tag);
  // Step 3's CUDA and NCCL calls for one op; throws on a failed call. Caller holds mu_.
  template <typename Enqueue>
  void EnqueueLocked(const char* kind, const std::shared_ptr<Work>& work,
                     std::vector<at::Tensor> keep_alive, Enqueue&& enqueue);
  // For a nonblocking communicator: polls ncclCommGetAsyncError until the last call is no
  // longer in progress; CommError on error or past `deadline`. Caller holds mu_.
  void AwaitIssued(const char* what, std::chrono::steady_clock::time_point deadline);
  void WatchdogLoop();
  // Step 4 for the oldest pending op, whose end event answered `queried` (not success):
  // why it failed, or "" while it still runs within its time. Caller holds mu_.
  std::string FailureOfOldestLocked(cudaError_t queried);
  // Aborts the communicator (once) and fails every pending Work; the first gets `reason`.
  // Caller holds mu_; returns the Works to complete (outside the lock) with their errors.
  std::vector<std::pair<std::shared_ptr<Work>, std::exception_ptr>> AbortLocked(
      const std::string& reason);
  cudaEvent_t TakeEventLocked();
  void ReturnEventLocked(cudaEvent_t event);

  const std::chrono::milliseconds timeout_;
  const int device_;
  Handles handles_;

  std::mutex mu_;  // everything below, and every NCCL call on handles_.comm
  std::condition_variable wake_;
  uint64_t next_seq_ = 0;
  std::map<TransferKey, uint64_t> next_transfer_;
  std::deque<Pending> pending_;
  std::vector<cudaEvent_t> free_events_;
  bool stopping_ = false;
  bool aborted_ = false;
  GroupHealth health_;
  std::thread watchdog_;
};

}  // namespace gradhub::ddp
