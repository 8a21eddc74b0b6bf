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

}  // namespace

NcclProcessGroup::NcclProcessGroup(const ProcessGroupOptions& options)
    : ProcessGroup(options.rank, options.size, options.name),
      timeout_(options.timeout),
      device_(options.device) {
  const std::string who = StrCat("process group '", name(), "' rank ", rank(), "/", size());
  GRADHUB_ARG_CHECK(options.size >= 1 && options.rank >= 0 && options.rank < options.size, who,
                    ": rank must be in [0, size)");
  GRADHUB_ARG_CHECK(options.store != nullptr, who, ": options.store is null");
  GRADHUB_ARG_CHECK(options.timeout.count() > 0, who, ": options.timeout must be positive");

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
  if (device_ < 0 || device_ >= count) {
    throw CommError(
        StrCat(who, ": options.device ", device_, " does not exist (", count, " GPUs visible)"));
  }

  DeviceGuard guard(device_);
  const std::string id_key = name() + "/nccl-id";
  try {
    GRADHUB_NCCL_CHECK(ncclGetVersion(&nccl_version_));
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
    GRADHUB_NCCL_CHECK(ncclCommInitRankConfig(&comm_, size(), id, rank(), &config));
    AwaitIssued("ncclCommInitRankConfig", Clock::now() + timeout_);
#else
    // Blocking init: a peer that never arrives makes this wait (NCCL < 2.14 has no
    // nonblocking communicators).
    GRADHUB_NCCL_CHECK(ncclCommInitRank(&comm_, size(), id, rank()));
#endif
    GRADHUB_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    GRADHUB_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&barrier_buffer_), sizeof(float)));
    GRADHUB_CUDA_CHECK(cudaMemset(barrier_buffer_, 0, sizeof(float)));
  } catch (const std::exception& e) {
    if (comm_ != nullptr) ncclCommAbort(comm_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    if (barrier_buffer_ != nullptr) cudaFree(barrier_buffer_);
    throw CommError(StrCat(who, ": NCCL initialisation on cuda:", device_,
                           " (unique id under store key '", id_key, "') failed: ", e.what()));
  }
  watchdog_ = std::thread([this] { WatchdogLoop(); });
}

NcclProcessGroup::~NcclProcessGroup() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (watchdog_.joinable()) watchdog_.join();  // it drains pending_ first, each op bounded

  DeviceGuard guard(device_);
  if (comm_ != nullptr) {
    bool finalized = false;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 14, 0)
    // Flush and tear down cooperatively; fall back to abort when it does not end in time.
    const ncclResult_t started = ncclCommFinalize(comm_);
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
      ncclCommDestroy(comm_);
    } else {
      ncclCommAbort(comm_);
    }
    comm_ = nullptr;
  }
  for (cudaEvent_t event : free_events_) cudaEventDestroy(event);
  if (barrier_buffer_ != nullptr) cudaFree(barrier_buffer_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

std::string NcclProcessGroup::Describe(const char* kind, uint64_t seq,
                                       const std::string& detail) const {
  return StrCat(kind, " #", seq, detail.empty() ? "" : " (" + detail + ")", " in group '", name(),
                "' rank ", rank(), "/", size());
}

void NcclProcessGroup::AwaitIssued(const char* what, Clock::time_point deadline) {
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 14, 0)
  auto pause = std::chrono::microseconds(10);
  for (;;) {
    ncclResult_t state = ncclSuccess;
    GRADHUB_NCCL_CHECK(ncclCommGetAsyncError(comm_, &state));
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

std::exception_ptr NcclProcessGroup::UnusableErrorLocked(const std::string& description) const {
  return std::make_exception_ptr(
      CommError(StrCat(description, ": process group '", name(),
                       "' is unusable after an earlier failure: ", broken_reason_)));
}

std::vector<std::pair<std::shared_ptr<Work>, std::exception_ptr>> NcclProcessGroup::AbortLocked(
    const std::string& reason) {
  if (broken_reason_.empty()) broken_reason_ = reason;
  if (!aborted_ && comm_ != nullptr) {
    // Ends kernels still waiting for a peer and frees the communicator; never hangs.
    ncclCommAbort(comm_);
    comm_ = nullptr;
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
std::shared_ptr<Work> NcclProcessGroup::Launch(const char* kind, const std::string& detail,
                                               bool empty, std::vector<at::Tensor> keep_alive,
                                               Enqueue&& enqueue) {
  std::vector<std::pair<std::shared_ptr<Work>, std::exception_ptr>> to_complete;
  std::shared_ptr<Work> work;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const uint64_t seq = next_seq_++;
    work = std::make_shared<Work>(Describe(kind, seq, detail), timeout_);
    if (!broken_reason_.empty()) {
      to_complete.emplace_back(work, UnusableErrorLocked(work->description()));
    } else if (empty) {
      to_complete.emplace_back(work, nullptr);
    } else {
      try {
        DeviceGuard guard(device_);
        const auto deadline = Clock::now() + timeout_;
        // Step 3: wait for the producer kernels, run, mark the end.
        cudaEvent_t ready = TakeEventLocked();
        GRADHUB_CUDA_CHECK(cudaEventRecord(ready, CurrentComputeStream(device_)));
        GRADHUB_CUDA_CHECK(cudaStreamWaitEvent(stream_, ready, 0));
        ReturnEventLocked(ready);  // the wait captured this record; reuse is safe
        enqueue();
        AwaitIssued(kind, deadline);
        cudaEvent_t done = TakeEventLocked();
        GRADHUB_CUDA_CHECK(cudaEventRecord(done, stream_));
        work->MarkStarted();
        pending_.push_back(Pending{work, done, deadline, std::move(keep_alive)});
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
    std::string failure;
    if (queried != cudaErrorNotReady) {
      failure = StrCat("CUDA error while waiting for completion: ", cudaGetErrorName(queried), ": ",
                       cudaGetErrorString(queried));
    } else {
      ncclResult_t async = ncclSuccess;
      if (comm_ != nullptr) ncclCommGetAsyncError(comm_, &async);
      if (async != ncclSuccess && !GRADHUB_NCCL_IN_PROGRESS(async)) {
        failure = "NCCL error: " + detail::DescribeNcclResult(async);
      } else if (Clock::now() > front.deadline) {
        failure = StrCat("timed out after ", timeout_.count(), " ms");
      }
    }
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
  const std::string where = StrCat("broadcast in group '", name(), "' rank ", rank(), "/", size());
  GRADHUB_ARG_CHECK(root >= 0 && root < size(), where, ": root ", root, " is not in [0, ", size(),
                    ")");
  const c10::Device device(c10::kCUDA, static_cast<c10::DeviceIndex>(device_));
  size_t total_bytes = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    detail::CheckTensorArg(where, StrCat("tensors[", i, "]"), tensors[i], device);
    total_bytes += tensors[i].nbytes();
  }
  const std::string detail =
      tensors.size() == 1
          ? StrCat(detail::DtypeName(tensors[0].scalar_type()), ", ", tensors[0].numel(),
                   " elements, root ", root)
          : StrCat(tensors.size(), " tensors, ", total_bytes, " bytes, root ", root);
  std::vector<at::Tensor> keep_alive = tensors;
  return Launch("broadcast", detail, total_bytes == 0, std::move(keep_alive), [&] {
    // Bytes are bytes: one call per tensor, grouped into one launch.
    GRADHUB_NCCL_CHECK(ncclGroupStart());
    for (const auto& t : tensors) {
      if (t.nbytes() == 0) continue;
      GRADHUB_NCCL_CHECK(
          ncclBroadcast(t.data_ptr(), t.data_ptr(), t.nbytes(), ncclUint8, root, comm_, stream_));
    }
    GRADHUB_NCCL_CHECK(ncclGroupEnd());
  });
}

std::shared_ptr<Work> NcclProcessGroup::AllReduce(at::Tensor tensor, ReduceOp op) {
  const std::string where = StrCat("allreduce in group '", name(), "' rank ", rank(), "/", size());
  detail::CheckTensorArg(where, "tensor", tensor,
                         c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(device_)));
  const ncclDataType_t type = NcclType(tensor.scalar_type());
  ncclRedOp_t nccl_op = ncclSum;
  switch (op) {
    case ReduceOp::kSum:
      nccl_op = ncclSum;
      break;
    case ReduceOp::kMax:
      nccl_op = ncclMax;
      break;
    case ReduceOp::kMin:
      nccl_op = ncclMin;
      break;
    case ReduceOp::kAverage:
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 10, 0)
      GRADHUB_ARG_CHECK(nccl_version_ >= NCCL_VERSION(2, 10, 0), where,
                        ": average needs ncclAvg (NCCL >= 2.10), the loaded NCCL is ",
                        nccl_version_);
      nccl_op = ncclAvg;
      break;
#else
      throw std::invalid_argument(where + ": average needs ncclAvg (NCCL >= 2.10 at build time)");
#endif
  }
  const std::string detail = StrCat(detail::DtypeName(tensor.scalar_type()), ", ", tensor.numel(),
                                    " elements, ", ReduceOpName(op));
  const bool empty = tensor.numel() == 0;
  return Launch("allreduce", detail, empty, {tensor}, [&] {
    GRADHUB_NCCL_CHECK(ncclAllReduce(tensor.data_ptr(), tensor.data_ptr(),
                                     static_cast<size_t>(tensor.numel()), type, nccl_op, comm_,
                                     stream_));
  });
}

std::shared_ptr<Work> NcclProcessGroup::AllGather(std::vector<at::Tensor> outputs,
                                                  at::Tensor input) {
  const std::string where = StrCat("allgather in group '", name(), "' rank ", rank(), "/", size());
  const c10::Device device(c10::kCUDA, static_cast<c10::DeviceIndex>(device_));
  detail::CheckTensorArg(where, "input", input, device);
  GRADHUB_ARG_CHECK(static_cast<int>(outputs.size()) == size(), where, ": outputs has ",
                    outputs.size(), " tensors, expected one per rank (", size(), ")");
  for (size_t r = 0; r < outputs.size(); ++r) {
    const std::string arg = StrCat("outputs[", r, "]");
    detail::CheckTensorArg(where, arg, outputs[r], device);
    GRADHUB_ARG_CHECK(outputs[r].scalar_type() == input.scalar_type(), where, ": ", arg,
                      " has dtype ", detail::DtypeName(outputs[r].scalar_type()), ", input has ",
                      detail::DtypeName(input.scalar_type()));
    GRADHUB_ARG_CHECK(outputs[r].sizes() == input.sizes(), where, ": ", arg, " has shape ",
                      outputs[r].sizes(), ", input has ", input.sizes());
  }
  const std::string detail =
      StrCat(detail::DtypeName(input.scalar_type()), ", ", input.numel(), " elements per rank");
  const size_t bytes = input.nbytes();
  std::vector<at::Tensor> keep_alive = outputs;
  keep_alive.push_back(input);
  return Launch("allgather", detail, bytes == 0, std::move(keep_alive), [&] {
    auto* base = static_cast<uint8_t*>(outputs[0].data_ptr());
    bool adjacent = true;
    for (size_t r = 0; r < outputs.size(); ++r) {
      adjacent = adjacent && outputs[r].data_ptr() == base + r * bytes;
    }
    if (adjacent) {  // outputs are slices of one flat tensor: gather straight into it
      GRADHUB_NCCL_CHECK(ncclAllGather(input.data_ptr(), base, bytes, ncclUint8, comm_, stream_));
      return;
    }
    // Separate outputs: rank r broadcasts its input into outputs[r] (NCCL's recipe for
    // gathering into separate buffers), grouped into one launch; no scratch memory.
    GRADHUB_NCCL_CHECK(ncclGroupStart());
    for (size_t r = 0; r < outputs.size(); ++r) {
      GRADHUB_NCCL_CHECK(ncclBroadcast(input.data_ptr(), outputs[r].data_ptr(), bytes, ncclUint8,
                                       static_cast<int>(r), comm_, stream_));
    }
    GRADHUB_NCCL_CHECK(ncclGroupEnd());
  });
}

std::shared_ptr<Work> NcclProcessGroup::Barrier() {
  return Launch("barrier", "", false, {}, [&] {
    GRADHUB_NCCL_CHECK(
        ncclAllReduce(barrier_buffer_, barrier_buffer_, 1, ncclFloat32, ncclSum, comm_, stream_));
  });
}

}  // namespace gradhub::ddp
