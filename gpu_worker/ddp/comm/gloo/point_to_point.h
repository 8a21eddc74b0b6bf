#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <tuple>
#include <vector>

#include "gpu_worker/ddp/comm/gloo/task_threads.h"
#include "gpu_worker/ddp/comm/gloo/traffic_sealing.h"
#include "gpu_worker/ddp/comm/group_health.h"
#include "gpu_worker/ddp/comm/process_group.h"

namespace gloo {
class Context;
}

namespace gradhub::ddp {

// Send and Recv of a GlooProcessGroup (ProcessGroup's point to point) over gloo's unbound
// buffers on the group's channel contexts.
//
// Matching. A transfer from rank S to rank R with tag t is the k-th of (S, R, t): each side
// counts its own Sends to, and Recvs from, each peer per tag, in issue order. Its two
// messages, a header and a payload, travel on channel t % channels (both ends pick the same)
// on the gloo slots PointToPointSlot(part, t, k):
//   bits 63..56  0x80 for the header, 0x81 for the payload: the high bit marks p2p. gloo's
//                collectives build their slots with prefixes 0x01 to 0x08 (gloo/types.h),
//                the sealed collectives with 0x47, and context->nextSlot() hands out small
//                numbers, so no collective's message can land in a p2p slot or the reverse;
//   bits 55..24  the tag;
//   bits 23..0   k mod 2^24. With k in the slot, the k-th message lands in the k-th receive
//                whatever order the threads of step 1 post them in. It wraps, which is safe
//                while fewer than 2^24 transfers of one pair and tag are in flight at once.
//
// One transfer (its deadline: issue time + the group's timeout):
//  1. Issue, on the caller's thread: the operands are checked (std::invalid_argument naming
//     the op and operand; nothing counted), k is taken, the Work is made, and the transfer is
//     handed to a thread of its own (TaskThreads). Send and Recv return at once; any number of
//     transfers with any peers and tags may be in flight, posted in any order on the two
//     sides, and none waits for another.
//  2. Sender: posts the header {bytes, elements, dtype}, then the payload (the tensor's
//     bytes; no payload for an empty tensor), each sealed first when the group encrypts, and
//     waits for both sends. gloo sends a payload once the receiver has posted its receive,
//     straight from the tensor (sealed: from a sealed copy); the Work completes when gloo has
//     written it, so the tensor may be reused.
//  3. Receiver: receives the header. When the element counts and dtypes agree it receives the
//     payload into the tensor (sealed: into a buffer, then opens it into the tensor). Else it
//     receives the payload into scratch, so that the pair stays in step and the group usable,
//     and fails the Work with CommError "...: size mismatch: rank S sent 1024 float32 elements
//     (4096 bytes), this rank expects 512 float32 elements (2048 bytes)". The shape is not
//     sent: a [2, 3] tensor is received into a [3, 2] one.
//  4. Any other failure -- gloo's timeout at the deadline, a closed connection (a dead peer),
//     a sealed message that fails authentication -- fails the Work with CommError
//     "<description>: <reason>" and breaks the group (GroupHealth), as a failed collective
//     does; on a timeout gloo itself closes every connection of that channel.
//
// Beside the collectives: transfers never enter the channels' queues, so a transfer does not
// wait behind a collective of the same group, nor a collective behind a transfer; they share
// the channel's TCP connections, and so its bandwidth. A Barrier does not wait for them.
//
// Thread-safety: Send and Recv may be called from any thread. Destruction waits for every
// transfer to end (each by its deadline).
class GlooPointToPoint {
 public:
  struct Setup {
    const ProcessGroup* group = nullptr;  // for descriptions: name, rank, size
    GroupHealth* health = nullptr;        // the group's, shared with its collectives
    std::vector<std::shared_ptr<gloo::Context>> contexts;  // one per channel, connected
    std::optional<TrafficKey> key;                         // set when the group encrypts
    std::chrono::milliseconds timeout{0};
  };

  // `setup.group` and `setup.health` must outlive this object.
  explicit GlooPointToPoint(Setup setup);
  ~GlooPointToPoint();
  GlooPointToPoint(const GlooPointToPoint&) = delete;
  GlooPointToPoint& operator=(const GlooPointToPoint&) = delete;

  std::shared_ptr<Work> Send(at::Tensor tensor, int dst, uint32_t tag);
  std::shared_ptr<Work> Recv(at::Tensor tensor, int src, uint32_t tag);

 private:
  struct Transfer;

  std::shared_ptr<Work> Issue(bool sending, at::Tensor tensor, int peer, uint32_t tag);
  // Steps 2 to 4 on the transfer's own thread.
  void Run(const Transfer& transfer);
  // Null unless the group encrypts: the cipher of the transfer's direction.
  std::unique_ptr<DirectionCipher> CipherFor(const Transfer& transfer) const;

  const Setup setup_;
  std::mutex mu_;
  // The next k for (sending, peer, tag).
  std::map<std::tuple<bool, int, uint32_t>, uint64_t> next_index_;
  // Last: destroyed first, so transfers end before what they use goes.
  TaskThreads threads_;
};

// The header's or the payload's slot (see GlooPointToPoint). Pure.
uint64_t PointToPointSlot(bool payload, uint32_t tag, uint64_t index);

}  // namespace gradhub::ddp
