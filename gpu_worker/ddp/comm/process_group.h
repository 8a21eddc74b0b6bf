#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gpu_worker/ddp/comm/work.h"
#include "gpu_worker/ddp/store.h"

namespace gradhub::ddp {

// A collective that neither completes nor fails within this long fails with CommError. Far
// below NCCL's 10 minutes: a dead peer must surface quickly so the job restarts.
inline constexpr std::chrono::milliseconds kDefaultCollectiveTimeout = std::chrono::seconds(60);

enum class ReduceOp { kSum, kAverage, kMax, kMin };

// "sum", "average", "max", "min": for error messages.
inline const char* ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kAverage:
      return "average";
    case ReduceOp::kMax:
      return "max";
    case ReduceOp::kMin:
      return "min";
  }
  return "?";
}
enum class Backend { kGloo, kNccl };

// "gloo", "nccl": for error messages.
const char* BackendName(Backend backend);

// Settings that only the Gloo backend reads.
struct GlooOptions {
  // Independent connections (each with its own thread), so that collectives issued back to
  // back -- gradient buckets -- run concurrently. Collective i uses channel i % channels,
  // which every rank computes the same way. One by default: a second made a lone 1 MiB
  // allreduce ~0.7 ms slower on loopback (each collective then lands on a cold connection and
  // threads) and DDP steps no faster (tests/bench/allreduce, tests/bench/ddp).
  int channels = 1;
  // Address this rank listens on for its peers; "" = the interface GLOO_SOCKET_IFNAME names,
  // else the machine's hostname, or 127.0.0.1 when it does not resolve to an address here.
  std::string hostname;
  // Allreduce through a shared-memory segment instead of TCP when every rank of the group is
  // on one host (and in one container) and every rank sets this; broadcast, allgather and
  // barrier stay on TCP. Same results bit for bit on every rank; for two ranks the same as
  // over TCP. On a 2-core machine, two ranks: a 1 MiB allreduce's bus bandwidth from 0.6 to
  // 5.7 GB/s, DDP steps from 0.92 / 0.87 to 0.68 / 0.76 of PyTorch DDP's time on the two MLPs
  // of tests/bench/ddp (tests/bench/allreduce, tests/bench/ddp).
  bool shared_memory = true;
  // Where rank 0 creates that segment (a few MiB; unlinked once every rank mapped it). A
  // tmpfs: /dev/shm is what shm_open uses.
  std::string shared_memory_dir = "/dev/shm";
  // Seal every message of allreduce, broadcast and allgather over TCP with AES-256-GCM under
  // a key rank 0 draws for the group and hands out through the store (gloo/sealed_channel.h;
  // a job's distributed.encryptTraffic). A message that fails authentication fails the
  // collective and breaks the group. Every rank must set the same value (a mismatch fails the
  // rendezvous with CommError naming this option). An allreduce through the shared-memory
  // segment stays as it is: that traffic never leaves the host. Costs bus bandwidth
  // (tests/bench/allreduce measures it).
  bool encrypt_traffic = false;
};

// Settings that only the NCCL backend reads.
struct NcclOptions {
  // CUDA device index of this rank.
  int device = 0;
};

// What every backend needs, plus the chosen backend's own settings. Only the settings of
// `backend` may be given: CreateProcessGroup refuses `nccl` with the Gloo backend and `gloo`
// with NCCL (std::invalid_argument naming the field), so no setting is silently ignored.
struct ProcessGroupOptions {
  Backend backend = Backend::kGloo;
  int rank = 0;
  int size = 1;
  // Rendezvous; keys are written under `name` + "/" so several groups can share one store
  // (wrap it in a PrefixStore to scope by job and attempt).
  std::shared_ptr<Store> store;
  // Names the group in errors and in store keys, e.g. "default" or "subgroup-0-2".
  std::string name = "default";
  std::chrono::milliseconds timeout = kDefaultCollectiveTimeout;
  // With Backend::kGloo only; unset means GlooOptions{}.
  std::optional<GlooOptions> gloo;
  // With Backend::kNccl only; unset means NcclOptions{}.
  std::optional<NcclOptions> nccl;
};

// Throws std::invalid_argument naming the group, the rank and the first bad field, e.g.
// "process group 'default' rank 0/2: options.nccl is set, but the backend is gloo". Every
// backend's constructor runs it.
void ValidateProcessGroupOptions(const ProcessGroupOptions& options);

// A set of ranks that run collectives together (c10d's ProcessGroup). Every collective is
// asynchronous and returns a Work; tensors must stay alive and unmodified until it completes.
// All ranks must issue the same collectives in the same order. Calls may come from any
// thread but must be issued in one agreed order per group (the Reducer issues from the
// autograd thread). Supported dtypes: float32, float64, float16, bfloat16, int64. Tensors
// must be contiguous, on CPU for Gloo and on the group's CUDA device for NCCL.
//
// Send and Recv (point to point) involve two ranks only, so they take no part in the
// collectives' common order: a Send or Recv never needs the other ranks, and a collective
// never waits for one (Barrier included). How each backend runs them beside its collectives
// -- in particular whether a rank may post them in any order -- is in its header
// (gloo/gloo_process_group.h: any order; nccl/nccl_process_group.h: issue order on one
// stream, so neighbours must post in a matching order).
class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& name() const { return name_; }

  // Copies `root`'s tensors to every rank, in place.
  virtual std::shared_ptr<Work> Broadcast(std::vector<at::Tensor> tensors, int root) = 0;
  // Reduces `tensor` across ranks in place. kAverage divides by size() after summing.
  virtual std::shared_ptr<Work> AllReduce(at::Tensor tensor, ReduceOp op = ReduceOp::kSum) = 0;
  // outputs[r] receives rank r's `input`; outputs has size() tensors shaped like `input`.
  virtual std::shared_ptr<Work> AllGather(std::vector<at::Tensor> outputs, at::Tensor input) = 0;
  virtual std::shared_ptr<Work> Barrier() = 0;

  // Memory for a tensor this group will allreduce again and again (the Reducer's gradient
  // buckets): `numel` zeroed elements of `options`' dtype, one dimension. A backend may place
  // it where its collectives reach every rank's copy without staging copies (NCCL's
  // registered buffers; Gloo on one host: gloo/shared_memory_buffers.h); any tensor still
  // works in any collective. Every rank must call it with the same sizes in the same order,
  // from one thread at a time; it may talk to the store, so it can throw CommError. The
  // default is at::zeros.
  virtual at::Tensor AllocateCollectiveBuffer(int64_t numel, const at::TensorOptions& options);

  // Point to point (pipeline stages): sends `tensor` to rank `dst` of this group. The message
  // matches the Recv on `dst` that names this rank as `src` and the same `tag`; between one
  // pair and one tag, messages match in the order they were issued. The Work completes when
  // the tensor may be reused (its bytes are sent or copied). Fails with CommError naming the
  // operation, group, peer and tag on the collective timeout or a dead peer.
  virtual std::shared_ptr<Work> Send(at::Tensor tensor, int dst, uint32_t tag) = 0;
  // Receives into `tensor` (shape and dtype must match the sender's; a size mismatch is a
  // CommError naming both sizes) from rank `src`. Completes when the bytes have arrived.
  virtual std::shared_ptr<Work> Recv(at::Tensor tensor, int src, uint32_t tag) = 0;
  // Whether two ranks may post the Sends and Recvs between them in different orders (Gloo),
  // rather than in one order (NCCL: a rank's transfers run in issue order on one stream, so a
  // receive posted early blocks the transfers issued after it). False unless a backend says
  // so: a caller that posts receives early asks first.
  virtual bool TransfersInAnyOrder() const { return false; }

 protected:
  ProcessGroup(int rank, int size, std::string name)
      : rank_(rank), size_(size), name_(std::move(name)) {}

 private:
  const int rank_, size_;
  const std::string name_;
};

// The one factory for every backend. Blocks until all `options.size` ranks have joined
// (through the store) or the timeout passes. Throws CommError naming what is wrong, e.g.
// NCCL requested in a build without it, or no GPU visible.
std::shared_ptr<ProcessGroup> CreateProcessGroup(const ProcessGroupOptions& options);

// A group of some ranks of `parent`, e.g. for hierarchical reduction. Every rank of the parent
// calls it with the same `ranks` (sorted, unique); ranks not in it get nullptr. The subgroup
// rendezvouses under the parent's store.
std::shared_ptr<ProcessGroup> CreateSubgroup(const ProcessGroupOptions& parent_options,
                                             const std::vector<int>& ranks);

}  // namespace gradhub::ddp
