#include "gpu_worker/ddp/comm/nccl/nccl_process_group.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <utility>

#include "gpu_worker/ddp/comm/checks.h"

namespace gradhub::ddp {
namespace {

using Clock = std::chrono::steady_clock;
using detail::StrCat;

// The stream the caller's kernels that produced the inputs run on (protocol step 3).
//
// Debian's libtorch is CPU-only and ships no c10_cuda library, so c10/cuda's
// getCurrentCUDAStream cannot be linked in every build. This returns the legacy default
// stream, which orders correctly for code that launches on the default stream (as libtorch
// does unless a stream guard is set). A build against a CUDA libtorch should return
// `at::cuda::getCurrentCUDAStream(device).stream()` here: this is the one place to change.
cudaStream_t CurrentComputeStream(int /*device*/) { return cudaStreamLegacy; }

// Sets the current device for a scope and restores the previous one. Never throws: it also
// runs in the destructor; a failing cudaSetDevice surfaces at the next checked call.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    if (previous_ != device) cudaSetDevice(device);
  }
  ~DeviceGuard() {
    if (previous_ >= 0) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

ncclDataType_t NcclType(at::ScalarType type) {
  switch (type) {
    case at::kFloat:
      return ncclFloat32;
    case at::kDouble:
      return ncclFloat64;
    case at::kHalf:
      return ncclFloat16;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 10, 0)
    case at::kBFloat16:
      return ncclBfloat16;
#endif
    case at::kLong:
      return ncclInt64;
    default:
      throw std::invalid_argument("dtype " + detail::DtypeName(type) +
                                  " has no NCCL type in this build");
  }
}

ncclRedOp_t NcclOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kMax:
      return ncclMax;
    case ReduceOp::kMin:
      return ncclMin;
    case ReduceOp::kAverage:
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 10, 0)
      return ncclAvg;
#else
      throw std::invalid_argument("average needs ncclAvg (NCCL >= 2.10 at build time)");
#endif
  }
  throw std::invalid_argument("unknown ReduceOp");
}

// Throws CommError unless `device` is a visible GPU.
void RequireDevice(const std::string& who, int device) {
  int count = 0;
  const cudaError_t counted = cudaGetDeviceCount(&count);
  if (counted != cudaSuccess || count == 0) {
    cudaGetLastError();  // do not leave the error for the caller's next CUDA call
    throw CommError(StrCat(who, ": the NCCL backend needs a GPU, but none is visible (",
                           counted != cudaSuccess
                               ? StrCat("cudaGetDeviceCount: ", cudaGetErrorName(counted), ": ",
                                        cudaGetErrorString(counted))
                               : std::string("cudaGetDeviceCount found 0 devices"),
                           ")"));
  }
  if (device >= count) {
    throw CommError(StrCat(who, ": options.nccl.device ", device, " does not exist (", count,
                           " GPUs visible)"));
  }
}

}  // namespace

NcclProcessGroup::NcclProcessGroup(const ProcessGroupOptions& options)
    : ProcessGroup(options.rank, options.size, options.name),
      timeout_(options.timeout),
      device_(options.nccl.value_or(NcclOptions{}).device) {
  ValidateProcessGroupOptions(options);
  RequireDevice(StrCat("process group '", name(), "' rank ", rank(), "/", size()), device_);
  InitCommunicator(options);
  watchdog_ = std::thread([this] { WatchdogLoop(); });
}

void NcclProcessGroup::InitCommunicator(const ProcessGroupOptions& options) {
  DeviceGuard guard(device_);
  const std::string id_key = name() + "/nccl-id";
  try {
    GRADHUB_NCCL_CHECK(ncclGetVersion(&handles_.nccl_version));
    // Step 1.
    ncclUniqueId id;
    if (rank() == 0) {
      GRADHUB_NCCL_CHECK(ncclGetUniqueId(&id));
      options.store->Set(id_key, std::string(id.internal, sizeof(id.internal)));
    } else {
      const std::string value = options.store->Get(id_key, timeout_);
      GRADHUB_COMM_ENFORCE(value.size() == sizeof(id.internal), "store key '", id_key, "' holds ",
                           value.size(), " bytes, an ncclUniqueId has ", sizeof(id.internal));
      std::memcpy(id.internal, value.data(), sizeof(id.internal));
    }
    // Step 2.
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 14, 0)
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    GRADHUB_NCCL_CHECK(ncclCommInitRankConfig(&handles_.comm, size(), id, rank(), &config));
    AwaitIssued("ncclCommInitRankConfig", Clock::now() + timeout_);
#else
    // Blocking init: a peer that never arrives makes this wait (NCCL < 2.14 has no
    // nonblocking communicators).
    GRADHUB_NCCL_CHECK(ncclCommInitRank(&handles_.comm, size(), id, rank()));
#endif
    GRADHUB_CUDA_CHECK(cudaStreamCreateWithFlags(&handles_.stream, cudaStreamNonBlocking));
    GRADHUB_CUDA_CHECK(
        cudaMalloc(reinterpret_cast<void**>(&handles_.barrier_buffer), sizeof(float)));
    GRADHUB_CUDA_CHECK(cudaMemset(handles_.barrier_buffer, 0, sizeof(float)));
  } catch (const std::exception& e) {
    if (handles_.comm != nullptr) ncclCommAbort(handles_.comm);
    if (handles_.stream != nullptr) cudaStreamDestroy(handles_.stream);
    if (handles_.barrier_buffer != nullptr) cudaFree(handles_.barrier_buffer);
    throw CommError(StrCat("process group '", name(), "' rank ", rank(), "/", size(),
                           ": NCCL initialisation on cuda:", device_,
                           " (unique id under store key '", id_key, "') failed: ", e.what()));
  }
}

NcclProcessGroup::~NcclProcessGroup() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (watchdog_.joinable()) watchdog_.join();  // it drains pending_ first, each op bounded

  DeviceGuard guard(device_);
  if (handles_.comm != nullptr) {
    bool finalized = false;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 14, 0)
    // Flush and tear down cooperatively; fall back to abort when it does not end in time.
    const ncclResult_t started = ncclCommFinalize(handles_.comm);
    if (started == ncclSuccess || GRADHUB_NCCL_IN_PROGRESS(started)) {
      try {
        AwaitIssued("ncclCommFinalize", Clock::now() + timeout_);
        finalized = true;
      } catch (const std::exception&) {
      }
    }
#else
    finalized = true;
#endif
    if (finalized) {
      ncclCommDestroy(handles_.comm);
    } else {
      ncclCommAbort(handles_.comm);
    }
    handles_.comm = nullptr;
  }
  for (cudaEvent_t event : free_events_) cudaEventDestroy(event);
  if (handles_.barrier_buffer != nullptr) cudaFree(handles_.barrier_buffer);
  if (handles_.stream != nullptr) cudaStreamDestroy(handles_.stream);
}

void NcclProcessGroup::AwaitIssued(const char* what, Clock::time_point deadline) {
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 14, 0)
  auto pause = std::chrono::microseconds(10);
  for (;;) {
    ncclResult_t state = ncclSuccess;
    GRADHUB_NCCL_CHECK(ncclCommGetAsyncError(handles_.comm, &state));
    if (state == ncclSuccess) return;
    if (state != ncclInProgress) {
      throw CommError(StrCat(what, " failed: ", detail::DescribeNcclResult(state)));
    }
    if (Clock::now() > deadline) {
      throw CommError(StrCat(what, " timed out after ", timeout_.count(), " ms"));
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(10000));
  }
#else
  (void)what;
  (void)deadline;
#endif
}

cudaEvent_t NcclProcessGroup::TakeEventLocked() {
  if (!free_events_.empty()) {
    cudaEvent_t event = free_events_.back();
    free_events_.pop_back();
    return event;
  }
  cudaEvent_t event = nullptr;
  GRADHUB_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  return event;
}

void NcclProcessGroup::ReturnEventLocked(cudaEvent_t event) { free_events_.push_back(event); }

std::vector<std::pair<std::shared_ptr<Work>, std::exception_ptr>> NcclProcessGroup::AbortLocked(
    const std::string& reason) {
  health_.MarkBroken(reason);
  if (!aborted_ && handles_.comm != nullptr) {
    // Ends kernels still waiting for a peer and frees the communicator; never hangs.
    ncclCommAbort(handles_.comm);
    handles_.comm = nullptr;
  }
  aborted_ = true;
  std::vector<std::pair<std::shared_ptr<Work>, std::exception_ptr>> failed;
  for (auto& pending : pending_) {
    const std::string message =
        failed.empty() ? reason
                       : StrCat(pending.work->description(), ": communicator of process group '",
                                name(), "' aborted after a failure: ", reason);
    failed.emplace_back(std::move(pending.work), std::make_exception_ptr(CommError(message)));
    // Fine while incomplete: the event is released once it completes.
    if (pending.done != nullptr) cudaEventDestroy(pending.done);
  }
  pending_.clear();
  return failed;
}

template <typename Enqueue>
void NcclProcessGroup::EnqueueLocked(const char* kind, const std::shared_ptr<Work>& work,
                                     std::vector<at::Tensor> keep_alive, Enqueue&& enqueue) {
  DeviceGuard guard(device_);
  const auto deadline = Clock::now() + timeout_;
  // Step 3: wait for the producer kernels, run, mark the end.
  cudaEvent_t ready = TakeEventLocked();
  GRADHUB_CUDA_CHECK(cudaEventRecord(ready, CurrentComputeStream(device_)));
  GRADHUB_CUDA_CHECK(cudaStreamWaitEvent(handles_.stream, ready, 0));
  ReturnEventLocked(ready);  // the wait captured this record; reuse is safe
  enqueue();
  AwaitIssued(kind, deadline);
  cudaEvent_t done = TakeEventLocked();
  GRADHUB_CUDA_CHECK(cudaEventRecord(done, handles_.stream));
  work->MarkStarted();
  pending_.push_back(Pending{work, done, deadline, std::move(keep_alive)});
}

template <typename Enqueue>
std::shared_ptr<Work> NcclProcessGroup::Launch(const char* kind,
                                               const detail::CheckedCollective& checked,
                                               std::vector<at::Tensor> keep_alive,
                                               Enqueue&& enqueue, const TransferKey* transfer) {
  std::vector<std::pair<std::shared_ptr<Work>, std::exception_ptr>> to_complete;
  std::shared_ptr<Work> work;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const uint64_t seq = transfer != nullptr ? next_transfer_[*transfer]++ : next_seq_++;
    work = std::make_shared<Work>(detail::DescribeCollective(*this, kind, seq, checked.detail),
                                  timeout_);
    if (health_.broken()) {
      to_complete.emplace_back(work, health_.UnusableError(work->description(), name()));
    } else if (checked.empty) {
      to_complete.emplace_back(work, nullptr);
    } else {
      try {
        EnqueueLocked(kind, work, std::move(keep_alive), std::forward<Enqueue>(enqueue));
      } catch (const std::exception& e) {
        pending_.push_front(Pending{work, nullptr, Clock::now(), {}});
        to_complete = AbortLocked(work->description() + ": " + e.what());
      }
    }
  }
  wake_.notify_one();
  for (auto& [done_work, error] : to_complete) done_work->Complete(error);
  return work;
}

std::string NcclProcessGroup::FailureOfOldestLocked(cudaError_t queried) {
  if (queried != cudaErrorNotReady) {
    return StrCat("CUDA error while waiting for completion: ", cudaGetErrorName(queried), ": ",
                  cudaGetErrorString(queried));
  }
  ncclResult_t async = ncclSuccess;
  if (handles_.comm != nullptr) ncclCommGetAsyncError(handles_.comm, &async);
  if (async != ncclSuccess && !GRADHUB_NCCL_IN_PROGRESS(async)) {
    return "NCCL error: " + detail::DescribeNcclResult(async);
  }
  if (Clock::now() > pending_.front().deadline) {
    return StrCat("timed out after ", timeout_.count(), " ms");
  }
  return "";
}

void NcclProcessGroup::WatchdogLoop() {
  DeviceGuard guard(device_);
  auto pause = std::chrono::microseconds(10);
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    if (pending_.empty()) {
      if (stopping_) return;
      wake_.wait(lock, [this] { return stopping_ || !pending_.empty(); });
      continue;
    }
    Pending& front = pending_.front();
    const cudaError_t queried = cudaEventQuery(front.done);
    if (queried == cudaSuccess) {
      std::shared_ptr<Work> work = std::move(front.work);
      ReturnEventLocked(front.done);
      pending_.pop_front();
      lock.unlock();
      work->Complete();
      lock.lock();
      pause = std::chrono::microseconds(10);
      continue;
    }
    const std::string failure = FailureOfOldestLocked(queried);
    if (!failure.empty()) {
      auto failed =
          AbortLocked(StrCat(front.work->description(), ": ", failure, "; communicator aborted"));
      lock.unlock();
      for (auto& [work, error] : failed) work->Complete(error);
      lock.lock();
      continue;
    }
    // Short polls while an op is young (small buckets complete in microseconds), backing
    // off to 1 ms for long ones.
    lock.unlock();
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(1000));
    lock.lock();
  }
}

std::shared_ptr<Work> NcclProcessGroup::Broadcast(std::vector<at::Tensor> tensors, int root) {
  const c10::Device device(c10::kCUDA, static_cast<c10::DeviceIndex>(device_));
  const detail::CheckedCollective checked = detail::CheckBroadcast(*this, device, tensors, root);
  std::vector<at::Tensor> keep_alive = tensors;
  return Launch("broadcast", checked, std::move(keep_alive), [&] {
    // Bytes are bytes: one call per tensor, grouped into one launch.
    GRADHUB_NCCL_CHECK(ncclGroupStart());
    for (const auto& t : tensors) {
      if (t.nbytes() == 0) continue;
      GRADHUB_NCCL_CHECK(ncclBroadcast(t.data_ptr(), t.data_ptr(), t.nbytes(), ncclUint8, root,
                                       handles_.comm, handles_.stream));
    }
    GRADHUB_NCCL_CHECK(ncclGroupEnd());
  });
}

std::shared_ptr<Work> NcclProcessGroup::AllReduce(at::Tensor tensor, ReduceOp op) {
  const c10::Device device(c10::kCUDA, static_cast<c10::DeviceIndex>(device_));
  const detail::CheckedCollective checked = detail::CheckAllReduce(*this, device, tensor, op);
  const ncclDataType_t type = NcclType(tensor.scalar_type());
  GRADHUB_ARG_CHECK(op != ReduceOp::kAverage || handles_.nccl_version >= NCCL_VERSION(2, 10, 0),
                    "allreduce in group '", name(), "' rank ", rank(), "/", size(),
                    ": average needs ncclAvg (NCCL >= 2.10), the loaded NCCL is ",
                    handles_.nccl_version);
  const ncclRedOp_t nccl_op = NcclOp(op);
  return Launch("allreduce", checked, {tensor}, [&] {
    GRADHUB_NCCL_CHECK(ncclAllReduce(tensor.data_ptr(), tensor.data_ptr(),
                                     static_cast<size_t>(tensor.numel()), type, nccl_op,
                                     handles_.comm, handles_.stream));
  });
}

std::shared_ptr<Work> NcclProcessGroup::AllGather(std::vector<at::Tensor> outputs,
                                                  at::Tensor input) {
  const c10::Device device(c10::kCUDA, static_cast<c10::DeviceIndex>(device_));
  const detail::CheckedCollective checked = detail::CheckAllGather(*this, device, outputs, input);
  const size_t bytes = input.nbytes();
  std::vector<at::Tensor> keep_alive = outputs;
  keep_alive.push_back(input);
  return Launch("allgather", checked, std::move(keep_alive), [&] {
    if (detail::IsOneFlatBuffer(outputs, bytes)) {  // slices of one flat tensor: straight in
      GRADHUB_NCCL_CHECK(ncclAllGather(input.data_ptr(), outputs[0].data_ptr(), bytes, ncclUint8,
                                       handles_.comm, handles_.stream));
      return;
    }
    // Separate outputs: rank r broadcasts its input into outputs[r] (NCCL's recipe for
    // gathering into separate buffers), grouped into one launch; no scratch memory.
    GRADHUB_NCCL_CHECK(ncclGroupStart());
    for (size_t r = 0; r < outputs.size(); ++r) {
      GRADHUB_NCCL_CHECK(ncclBroadcast(input.data_ptr(), outputs[r].data_ptr(), bytes, ncclUint8,
                                       static_cast<int>(r), handles_.comm, handles_.stream));
    }
    GRADHUB_NCCL_CHECK(ncclGroupEnd());
  });
}

std::shared_ptr<Work> NcclProcessGroup::Barrier() {
  return Launch("barrier", detail::CheckedCollective{}, {}, [&] {
    GRADHUB_NCCL_CHECK(ncclAllReduce(handles_.barrier_buffer, handles_.barrier_buffer, 1,
                                     ncclFloat32, ncclSum, handles_.comm, handles_.stream));
  });
}

std::shared_ptr<Work> NcclProcessGroup::Send(at::Tensor tensor, int dst, uint32_t tag) {
  return Transfer(/*sending=*/true, std::move(tensor), dst, tag);
}

std::shared_ptr<Work> NcclProcessGroup::Recv(at::Tensor tensor, int src, uint32_t tag) {
  return Transfer(/*sending=*/false, std::move(tensor), src, tag);
}

// Issue order is the only matching there is (no tags, no sizes), so the caller keeps both
// sides of a pair in one order; how the pipeline does, and why it cannot deadlock, is in the
// header ("How the pipeline orders its transfers").
std::shared_ptr<Work> NcclProcessGroup::Transfer(bool sending, at::Tensor tensor, int peer,
                                                 uint32_t tag) {
  const c10::Device device(c10::kCUDA, static_cast<c10::DeviceIndex>(device_));
  detail::CheckedCollective checked =
      detail::CheckPointToPoint(*this, device, sending, tensor, peer, tag);
  // Nothing to move; the peer's tensor is empty too (sizes must match), so it skips as well.
  checked.empty = tensor.numel() == 0;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 7, 0)
  const ncclDataType_t type = NcclType(tensor.scalar_type());
  const TransferKey key{sending, peer, tag};
  return Launch(
      sending ? "send" : "recv", checked, {tensor},
      [&] {
        const size_t count = static_cast<size_t>(tensor.numel());
        if (sending) {
          GRADHUB_NCCL_CHECK(
              ncclSend(tensor.data_ptr(), count, type, peer, handles_.comm, handles_.stream));
        } else {
          GRADHUB_NCCL_CHECK(
              ncclRecv(tensor.data_ptr(), count, type, peer, handles_.comm, handles_.stream));
        }
      },
      &key);
#else
  throw std::invalid_argument(StrCat(sending ? "send" : "recv", " in group '", name(),
                                     "': point to point needs ncclSend/ncclRecv (NCCL >= 2.7)"));
#endif
}

}  // namespace gradhub::ddp
