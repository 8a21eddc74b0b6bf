#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "gpu_worker/ddp/comm/gloo/point_to_point.h"
#include "gpu_worker/ddp/comm/gloo/sealed_channel.h"
#include "gpu_worker/ddp/comm/gloo/shared_memory_allreduce.h"
#include "gpu_worker/ddp/comm/gloo/shared_memory_buffers.h"
#include "gpu_worker/ddp/comm/group_health.h"
#include "gpu_worker/ddp/comm/process_group.h"

namespace gloo {
class Context;
namespace rendezvous {
class Context;
}
namespace transport {
class Device;
}
}  // namespace gloo

namespace gradhub::ddp {

// ProcessGroup on gloo's TCP transport, for CPU tensors (c10d's ProcessGroupGloo).
//
// Protocol:
//  1. Construction resolves the address to listen on: GlooOptions::hostname; when it is
//     empty, the interface GLOO_SOCKET_IFNAME names (as torch's ProcessGroupGloo reads it;
//     its first address); else the machine's hostname if it resolves to an address this
//     machine can bind, else 127.0.0.1 (enough for ranks on one machine; multi-node jobs pass
//     a routable address: the agent sets it, gpu_worker/agent/node_address.h).
//  2. For each channel i in [0, GlooOptions::channels) it creates a TCP device (its own event
//     loop thread) and a gloo::rendezvous::Context, connected full mesh through the store
//     under `options.name + "/channel-<i>/"`. A peer that does not arrive within
//     options.timeout makes the constructor throw CommError. Group names must be unique per
//     store: a second group with the same name on the same store would read the first one's
//     stale addresses.
//  3. The ranks agree through the store whether they encrypt their traffic
//     (GlooOptions::encrypt_traffic, which must be the same on every rank) and on the group's
//     key (TrafficKeyAgreement in sealed_channel.h). Encrypting, every channel's allreduce (over
//     TCP), broadcast and allgather seal every message (SealedChannel); the barrier carries no
//     data and the shared-memory allreduce no traffic off the host, so both stay as they are.
//  4. The ranks agree through the store whether allreduces go through a shared-memory segment
//     (all on one host, GlooOptions::shared_memory on every rank; see SharedMemorySetup), one per
//     channel. A failure to set it up on any rank makes every rank use TCP, logged once by
//     rank 0 on stderr. With segments, AllocateCollectiveBuffer places buffers in shared
//     memory too (SharedMemoryBuffers), and an allreduce of a tensor inside one runs in place.
//  5. The k-th collective issued (k = 0, 1, ...; every rank counts the same) is queued on
//     channel k % channels, whose own thread runs its queue in FIFO order, with gloo tag k
//     and gloo timeout options.timeout (an allreduce on a channel with a segment runs there, with
//     the same timeout, instead). With several channels, back-to-back gradient buckets
//     therefore run concurrently on different connections. Collectives of size 0 complete at
//     once without touching the network (they still take a number, so every rank stays in
//     step).
//  6. Barrier first waits (locally) for every collective issued before it, then runs
//     gloo::barrier: when it completes, all earlier collectives of this rank have completed
//     and every rank has reached the barrier.
//  7. The first collective that fails (peer closed, I/O error, timeout, a sealed message that
//     fails authentication) breaks the group:
//     queued and later collectives fail at once with CommError "process group 'x' is
//     unusable after an earlier failure: <first error>". The job is expected to restart.
//
// A dead peer fails a shared-memory allreduce as soon as its process is gone (checked every
// 100 ms while waiting), else at the timeout, with the same CommError as over TCP.
//
// Collectives in flight at the same time may run concurrently, so a tensor must not be
// passed to a second collective before the first one's Work completed.
//
// Thread-safety: collectives may be issued from any thread (serialised internally, in
// issue order); Work handles are completed by the channel threads. Destruction drains the
// queues while the group is healthy and fails what is left once it is broken; since every
// collective ends within options.timeout, it does not hang on a dead peer.
class GlooProcessGroup final : public ProcessGroup {
 public:
  // Rendezvous (blocks until every rank connected). Throws CommError naming the group, the
  // rank and the reason; std::invalid_argument for options ValidateProcessGroupOptions
  // refuses (options.gloo unset means GlooOptions{}).
  explicit GlooProcessGroup(const ProcessGroupOptions& options);
  ~GlooProcessGroup() override;

  std::shared_ptr<Work> Broadcast(std::vector<at::Tensor> tensors, int root) override;
  std::shared_ptr<Work> AllReduce(at::Tensor tensor, ReduceOp op = ReduceOp::kSum) override;
  std::shared_ptr<Work> AllGather(std::vector<at::Tensor> outputs, at::Tensor input) override;
  std::shared_ptr<Work> Barrier() override;
  // In shared memory when the group's allreduces are (step 4), so that they run in place
  // (SharedMemoryAllReduce::AllReduceInPlace); else, or when a rank cannot, at::zeros.
  at::Tensor AllocateCollectiveBuffer(int64_t numel, const at::TensorOptions& options) override;
  // Point to point (gloo/point_to_point.h), beside the steps above: on the channels'
  // connections, but never in their queues and without a sequence number, so transfers and
  // collectives never wait for one another, and a rank may post its transfers in any order.
  // A failed transfer breaks the group as in step 7, but for a size mismatch.
  std::shared_ptr<Work> Send(at::Tensor tensor, int dst, uint32_t tag) override;
  std::shared_ptr<Work> Recv(at::Tensor tensor, int src, uint32_t tag) override;
  bool TransfersInAnyOrder() const override { return true; }

  // What the group listens on (after the fallbacks of step 1: "interface eth1" when it came
  // from GLOO_SOCKET_IFNAME), for logs.
  const std::string& listen_hostname() const { return hostname_; }
  int channels() const { return static_cast<int>(channels_.size()); }
  // Whether allreduces go through shared memory (step 4); the same on every rank.
  bool uses_shared_memory() const { return channels_.front()->shared_memory != nullptr; }
  // Whether an allreduce of `tensor` would run in place, i.e. it lies in a buffer from
  // AllocateCollectiveBuffer that lives in shared memory; the same on every rank.
  bool ReducesInPlace(const at::Tensor& tensor) const {
    return buffers_ != nullptr && buffers_->Find(tensor.data_ptr(), tensor.nbytes()).has_value();
  }
  // Whether collectives over TCP are sealed (step 3); the same on every rank.
  bool encrypts_traffic() const { return channels_.front()->sealed != nullptr; }

 private:
  struct Channel;
  // One queued collective. `run` does the transfer on the channel: gloo's tag is the
  // sequence number's low 32 bits, a sealed message's label has all 64.
  using RunFn = std::function<void(Channel&, uint64_t seq)>;
  struct Op {
    uint64_t seq = 0;
    std::shared_ptr<Work> work;
    // Barrier only: collectives issued before it that were not complete at issue time.
    std::vector<std::shared_ptr<Work>> prior;
    RunFn run;
  };
  struct Channel {
    int index = 0;
    std::shared_ptr<gloo::transport::Device> device;
    std::shared_ptr<gloo::rendezvous::Context> context;
    // Null when the group uses TCP for allreduce.
    std::unique_ptr<SharedMemoryAllReduce> shared_memory;
    // Null unless the group encrypts its traffic.
    std::unique_ptr<SealedChannel> sealed;
    std::mutex mu;
    std::condition_variable wake;
    std::deque<std::unique_ptr<Op>> queue;
    bool stopping = false;
    std::thread thread;
  };

  // Takes the next sequence number and queues `run` on its channel, or completes the Work at
  // once when the group is broken or `empty`. `detail` describes the operands; with
  // `after_prior` the op first waits for every collective issued before it (Barrier).
  std::shared_ptr<Work> Submit(const char* kind, const std::string& detail, bool empty,
                               bool after_prior, RunFn run);
  // Protocol steps 2 to 4, for the constructor.
  void ConnectChannels(const ProcessGroupOptions& options, const GlooOptions& gloo);
  void SetUpSharedMemory(const ProcessGroupOptions& options, const GlooOptions& gloo);
  // Returns the group key when the group encrypts.
  std::optional<TrafficKey> SetUpSealing(const ProcessGroupOptions& options,
                                         const GlooOptions& gloo);
  void RunChannel(Channel& channel);
  // An allreduce on its channel: in place through shared memory when `copies` are its
  // ranks' copies, else staged through the segment, else over TCP (sealed or not).
  void RunAllReduce(Channel& channel, uint64_t seq, const at::Tensor& tensor,
                    const std::optional<SharedMemoryBuffers::Copies>& copies,
                    const detail::ReduceKernel& kernel);
  void WaitForPrior(const Op& op) const;

  const std::chrono::milliseconds timeout_;
  // "process group 'x' rank r/n": starts construction errors.
  const std::string who_;
  // Step 1's outcome, for every channel's device: one of the two is set.
  std::string listen_hostname_, listen_interface_;
  std::string hostname_;  // what the group listens on, as said in errors ("interface eth1")
  std::vector<std::unique_ptr<Channel>> channels_;

  std::mutex issue_mu_;  // sequence numbers and queue order
  uint64_t next_seq_ = 0;
  // Issued and not yet known to be complete (what a Barrier waits for); pruned at each issue.
  std::vector<std::shared_ptr<Work>> in_flight_;

  // Set when the group has shared-memory segments (step 4).
  std::unique_ptr<SharedMemoryBuffers> buffers_;
  GroupHealth health_;
  // Reset first in the destructor: its transfers use the channels' contexts and health_.
  std::unique_ptr<GlooPointToPoint> p2p_;
};

}  // namespace gradhub::ddp
