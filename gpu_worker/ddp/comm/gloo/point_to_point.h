#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
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

// The largest payload that rides in its header's message (GlooPointToPoint, "Messages").
inline constexpr size_t kPointToPointInlineMaxBytes = 64 << 10;

// Send and Recv of a GlooProcessGroup (ProcessGroup's point to point) over gloo's unbound
// buffers on the group's channel contexts.
//
// gloo's tcp transport (pair.cc) writes an unbound buffer's send only once the receiver's
// matching recv has told the sender it is posted (a "recv ready" notice per slot), and
// writes it at once, on the thread that posts the send, when that notice came first. A
// receive must be posted with at least the bytes that are sent: more bytes than posted fail a
// check on gloo's event-loop thread, which ends the process; fewer are fine. So the receiver
// posts its receives up front: the header's with room for the largest header message, and
// the payload's, when the payload does not ride inline, on a slot that carries its size, so
// that a payload can only land in a receive of exactly its size. No message waits for an
// answer to another one.
//
// Messages. A payload of up to kPointToPointInlineMaxBytes rides in its header's message: one
// message per transfer. Each gloo message costs three writes and three reads on loopback (a
// "send ready" and a "recv ready" notice, then the data) and wakes gloo's event loop on each
// side, which on a 2-core VM cost more than copying 64 KiB on each end: the round trip of 8
// floats went from 0.21-0.22 to 0.14-0.18 ms, and of 64 KiB from 0.27-0.28 to 0.17 ms
// (bench_pipeline pingpong, old and new build alternately; PyTorch gloo 0.09-0.13 ms). The
// limit is below glibc's default mmap threshold (128 KiB), so the receiver's buffer for the
// header's message never costs a mapping. A larger payload travels on its own, straight from
// and into the tensor.
//
// Matching. A transfer from rank S to rank R with tag t is the k-th of (S, R, t): each side
// counts its own Sends to, and Recvs from, each peer per tag, in issue order. Its messages,
// the header (with an inline payload) and a larger payload, travel on channel t % channels
// (both ends pick the same):
//   header  PointToPointSlot(t, k): bits 63..56 0x80, bits 55..24 the tag, bits 23..0 k mod
//           2^24. The high bit marks p2p: gloo's collectives build their slots with prefixes
//           0x01 to 0x08 (gloo/types.h), the sealed collectives with 0x47, and
//           context->nextSlot() hands out small numbers, so no collective's message can land
//           in a p2p slot or the reverse. With k in the slot, the k-th message lands in the
//           k-th receive whatever order either side posts them in. It wraps, which is safe
//           while fewer than 2^24 transfers of one pair and tag are in flight at once.
//   payload PointToPointPayloadSlot(t, k, size): bits 63..56 0x81, bits 55..0 the header
//           slot's low 56 bits XOR a 56-bit hash of the size {bytes, elements, dtype} and k's
//           bits above 24. For one size the map from (t, k) is one to one, as the header's;
//           transfers of different sizes share a slot with odds of 2^-56.
//
// One transfer (its deadline: issue time + the group's timeout):
//  1. Issue, on the caller's thread: the operands are checked (std::invalid_argument naming
//     the op and operand; nothing counted), k is taken and the Work made (failed at once when
//     the group is broken). Then the messages are posted to gloo, which does not block:
//       sender: the header {bytes, elements, dtype}, followed in the same message by a
//       payload of up to kPointToPointInlineMaxBytes (the tensor's bytes, copied); a larger
//       payload on the slot of the tensor's own size, from the tensor. When the group
//       encrypts, header and payload are each sealed under their own label (a larger payload
//       is sealed and posted in step 2);
//       receiver: a receive for the header's message into a buffer with room for an inline
//       payload, and when it expects a larger payload, one on the slot of that size, straight
//       into the tensor (sealed: into a buffer).
//     Then the transfer is handed to a thread of its own (TaskThreads), which waits for it
//     and completes the Work. Send and Recv return at once; any number of transfers with any
//     peers and tags may be in flight, posted in any order on the two sides, and none waits
//     for another. Steps 2 to 4 run once, on whichever thread claims the transfer first: its
//     task thread, or a thread that waits for its Work with the group's timeout
//     (Work::LetWaiterFinish). A waiter that claims it runs them itself, which spares the
//     transfer two thread wake-ups on its critical path (the task thread's, then the
//     waiter's): the median round trip of 8 floats went from 0.243 to 0.222 ms over 8
//     alternating runs on a quiet 2-core machine, against gloo's own 0.095-0.124 ms
//     (bench_pipeline pingpong, pytorch_pingpong.py). The task thread still starts for every
//     transfer, so that one nobody waits for still ends (its sealed payload posted, a
//     mismatched payload drained); it returns at once when a waiter has the transfer.
//     Destruction first stops waiters from claiming and waits for those that did.
//  2. Sender, on the thread that finishes it: seals and posts a payload that step 1 left to
//     it, then waits for both sends. gloo writes the payload straight from the tensor
//     (sealed: from a sealed copy) once the receive is posted; the Work completes when gloo
//     has written it, so the tensor may be reused.
//  3. Receiver, on the thread that finishes it: waits for the header (sealed: opens it).
//     When its size is the expected one it copies the inline payload into the tensor, or
//     waits for the larger payload (sealed: opens either into the tensor). Else it fails the
//     Work with CommError "...: size mismatch: rank S sent 1024 float32 elements (4096
//     bytes), this rank expects 512 float32 elements (2048 bytes)", after receiving a larger
//     payload from the slot it was sent to into scratch, so that nothing stays queued on the
//     connection and the group stays usable. The tensor is not written. A receive posted for
//     a larger expected size stays posted in gloo (a few bytes of its bookkeeping) with its
//     buffer gone. The shape is not sent: a [2, 3] tensor is received into a [3, 2] one.
//  4. Any other failure -- gloo's timeout at the deadline, a closed connection (a dead peer),
//     a sealed message that fails authentication, gloo refusing a post -- fails the Work
//     with CommError "<description>: <reason>" and breaks the group (GroupHealth), as a
//     failed collective does; on a timeout gloo itself closes every connection of that
//     channel.
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
  class FinishClaims;

  std::shared_ptr<Work> Issue(bool sending, at::Tensor tensor, int peer, uint32_t tag);
  // Steps 2 to 4 on the transfer's own thread.
  void Finish(Transfer& transfer);
  // Step 3's size mismatch fails the Work alone; anything else also breaks the group.
  void Fail(const Transfer& transfer, std::exception_ptr error);
  // Null unless the group encrypts: the cipher of the transfer's direction.
  std::unique_ptr<DirectionCipher> CipherFor(const Transfer& transfer) const;

  const Setup setup_;
  // Shared with the Works' LetWaiterFinish, which may outlive this object.
  const std::shared_ptr<FinishClaims> claims_;
  std::mutex mu_;
  // The next k for (sending, peer, tag).
  std::map<std::tuple<bool, int, uint32_t>, uint64_t> next_index_;
  // Last: destroyed first, so transfers end before what they use goes.
  TaskThreads threads_;
};

// The slots of a transfer's header and payload (see GlooPointToPoint). Pure.
uint64_t PointToPointSlot(uint32_t tag, uint64_t index);
uint64_t PointToPointPayloadSlot(uint32_t tag, uint64_t index, uint64_t bytes, int64_t elements,
                                 int32_t dtype);

}  // namespace gradhub::ddp
