// The cross-stage autograd pair: how a backward pass crosses from one pipeline stage (a
// process) to the previous one.
//
//   stage s-1                                stage s
//   ---------                                -------
//   y = chunk(x)                             x = ReceiveActivation(from s-1)   [grad_fn A]
//   t = SendActivation(y, to s)  [grad_fn B] y = chunk(x)
//   ...                                      t = SendActivation(y, to s+1) or the loss
//   t.backward():                            t.backward():
//     B receives dL/dy from s  <------------   ... A sends dL/dx to s-1
//     and backward goes on in s-1's graph
//
// - ReceiveActivation receives stage s's input (one message in the steady state, see
//   Activations below) and returns it as a tensor whose grad_fn (A) SENDS the gradient of that
//   input back to the previous stage when stage s's backward reaches it.
// - SendActivation sends stage s's output to the next stage and returns a scalar "terminal"
//   whose grad_fn (B) RECEIVES the gradient of the output from the next stage and passes it
//   on into stage s's graph.
// So on every stage `terminal.backward()` (on the last stage: the loss's) runs this stage's
// backward and, through A, drives the previous stage's: the backward pass crosses processes.
// Each stage runs its own backward() calls, in the order its schedule says.
//
// Relation to PyTorch's distributed autograd (torch.distributed.autograd). There, an RPC
// records a SendRpcBackward node on the sender and a RecvRpcBackward node on the receiver,
// keyed by a distributed autograd context per step; dist_autograd.backward(context, [loss])
// on one worker walks the whole distributed graph, sending gradients by RPC and running each
// worker's part when its gradients arrive. B plays SendRpcBackward's part (on the side that
// sent a tensor, it takes the gradient coming back) and A RecvRpcBackward's (on the side that
// received it, it sends the gradient back), but nothing else carries over: no RPC, no context,
// no engine driving other workers. PyTorch's RPC pipeline (Pipe) was
// retired; Megatron-LM, torchtitan and torch.distributed.pipelining use point-to-point
// send/recv with an explicit schedule, and so does this: the schedule, not the autograd
// engine, decides when each micro-batch's backward runs, which is what bounds activation
// memory (1F1B) and keeps the order of messages deterministic, so that neighbouring stages
// always post matching sends and receives and never deadlock. The nodes are
// torch::autograd::Node subclasses (as PyTorch's two are) rather than
// torch::autograd::Function: they hold their C++ state (the traffic, the peer, the tag)
// directly, where a Function's context holds only IValues.
//
// Activations. The receiver must post a receive of exactly the size that arrives (Gloo ends
// the process on a larger message; point_to_point.h refuses any other size), yet only the
// sender knows an activation's shape. Both sides of a boundary therefore remember the shape
// of the last activation that crossed it (StageTraffic's ActivationLink, one per peer and
// boundary and direction), and expect the next one to have the same shape, as every
// micro-batch of a step does in practice. Per activation:
//  1. The receiver posts a kActivation receive of the header (96 bytes) plus the expected
//     values (none before the first activation). It may post it ahead, before its forward
//     needs it (PostActivationReceive), so that the message lands while it computes.
//  2. The sender sends one kActivation message of exactly that size: the header {dtype, dims,
//     sizes, where} and, when the activation has the expected shape, its values
//     (where = inline). Otherwise (the first activation, the last batch of an evaluation)
//     the header says where = follows, the values part is zeros, and the values go next as a
//     kResizedActivation message of the activation's own size.
//  3. The receiver reads the header: inline values are the activation (no copy); otherwise it
//     receives the kResizedActivation message into a tensor of the header's shape.
//  4. Both remember the activation's shape for the next one.
// The expected shape is a function of the boundary's history, the same on both sides, because
// a boundary's activations are sent and received in the same order (forward order, which
// neighbours share in every schedule); so every message's size is agreed by protocol. The
// steady state costs one message and one copy of the values into it on the sender (the header
// and values must go as one message); the two messages of a shape change cost what every
// activation cost before (a header, then the values once the header was read).
//
// Tags. Every message between two ranks is told apart by its tag, so messages can never be
// mismatched (a micro-batch's gradient taken for another's):
//
//   tag = kind | boundary << 2 | micro_batch << 14          (kind: MessageKind, 2 bits)
//
// where boundary k is the edge between virtual stages k and k + 1 (k = the virtual stage of
// the activation's sender; with one chunk per stage, the sending stage), below 2^12, and
// micro_batch is below 2^18. One tag is used once per step; across steps the process group
// matches messages of one (pair, tag) in issue order. (NCCL ignores tags and matches a pair's
// messages by order alone; the runner's order makes both agree: GradientReceivesAhead.)
//
// Sends are asynchronous: StageTraffic keeps every send's Work and tensor until it
// completed, drops completed ones between actions (rethrowing a failure) and waits for the rest
// at the end of the step; none is ever dropped unfinished.
//
// Thread-safety: StageTraffic is thread-safe (grad_fns may run on an autograd device thread).
// The functions are called by the stage's training thread.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "gpu_worker/ddp/comm/process_group.h"

namespace gradhub::ddp::pipeline {

// What a message between two stages carries: the low two bits of its tag.
enum class MessageKind : uint32_t {
  kResizedActivation = 0,  // an activation's values when its shape was not the expected one
  kActivation = 1,         // a stage's output to the next stage: header, and values (above)
  kGradient = 2,           // the gradient of that output, back to its sender
  kLoss = 3,               // the step's loss, from the last stage to stage 0 (boundary 0, mb 0)
};

inline constexpr int kMaxBoundaries = 1 << 12;
inline constexpr int kMaxMicroBatches = 1 << 18;
// An activation has at most this many dimensions (its header is fixed-size).
inline constexpr int kMaxActivationDims = 8;

// One side of one boundary with one peer (see Activations above): the shape of the last
// activation that crossed it, and on the receiving side the receive posted ahead, if any.
struct ActivationLink {
  bool crossed = false;  // an activation crossed already; dtype and sizes are its
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> sizes;
  int posted_micro_batch = -1;  // the posted receive's micro-batch; -1: none posted
  std::shared_ptr<Work> posted;
  at::Tensor message;  // where the posted receive lands
};

// The tag above. Throws std::invalid_argument naming boundary or micro_batch when it is out
// of range.
uint32_t MessageTag(MessageKind kind, int boundary, int micro_batch);

// One stage's point-to-point traffic in one step: sends in flight, bytes and seconds.
class StageTraffic {
 public:
  struct Totals {
    int64_t bytes_sent = 0;
    int64_t bytes_received = 0;
    std::chrono::nanoseconds send{0};          // issuing sends, and waiting for them at the end
    std::chrono::nanoseconds receive_wait{0};  // blocked until a receive completed
  };

  // Messages go to and come from ranks of `group`; received tensors are made on `device`.
  StageTraffic(std::shared_ptr<ProcessGroup> group, c10::Device device);
  // Does not wait: a step that failed leaves its sends to the process group, which holds
  // their tensors until they end (by its timeout at the latest).
  ~StageTraffic();
  StageTraffic(const StageTraffic&) = delete;
  StageTraffic& operator=(const StageTraffic&) = delete;

  // Starts sending `tensor` (contiguous) and keeps it and its Work until it completed.
  void Send(at::Tensor tensor, int dst, uint32_t tag);
  // Receives into `tensor`; blocks until it arrived. Throws CommError as the group does.
  // The same as PostReceive, then WaitForReceive.
  void Receive(const at::Tensor& tensor, int src, uint32_t tag);
  // Starts receiving into `tensor` and returns at once; `tensor` must stay alive until the
  // receive is waited for.
  std::shared_ptr<Work> PostReceive(const at::Tensor& tensor, int src, uint32_t tag);
  // Blocks until the posted receive into `tensor` completed (counted as a receive).
  void WaitForReceive(Work& work, const at::Tensor& tensor);
  // Drops the sends that completed; rethrows the error of one that failed.
  void ReleaseCompletedSends();
  // Waits for every send still in flight (the end of a step).
  void WaitForSends();

  Totals totals() const;
  int64_t sends_in_flight() const;
  c10::Device device() const { return device_; }

  // The link of one boundary with `peer`, as sender or receiver (made on first use). For the
  // activation functions below: only the stage's training thread may use it.
  ActivationLink& Link(bool sending, int peer, int boundary);

 private:
  struct PendingSend {
    std::shared_ptr<Work> work;
    at::Tensor tensor;  // alive until the work completed
  };

  const std::shared_ptr<ProcessGroup> group_;
  const c10::Device device_;
  mutable std::mutex mu_;
  std::vector<PendingSend> pending_;
  Totals totals_;
  std::map<std::tuple<bool, int, int>, ActivationLink> links_;  // by (sending, peer, boundary)
};

// Where one micro-batch crosses one boundary: the neighbour on the other side and the tag's
// parts.
struct Crossing {
  std::shared_ptr<StageTraffic> traffic;
  int peer = 0;      // the neighbour's rank in the traffic's group
  int boundary = 0;  // see the tags above
  int micro_batch = 0;
};

// Receives this stage's input from `from_previous.peer` (blocks) and returns it on the
// traffic's device. It requires grad: when backward reaches it, its gradient is sent back
// (asynchronously; zeros if the stage did not use its input). Throws CommError for a
// malformed header or an activation that is not floating point.
at::Tensor ReceiveActivation(const Crossing& from_previous);

// Posts the receive of the activation ReceiveActivation (or ReceiveActivationValues) will take
// across `from_previous`, ahead of it, so that it can land before the forward needs it. At
// most one per boundary and peer at a time, posted after the boundary's previous activation
// was received (its shape is the expected one); throws std::logic_error otherwise. Its buffer
// (the header and the expected values) is allocated now.
void PostActivationReceive(const Crossing& from_previous);

// The activation protocol without autograd (evaluation): sends `activation` across `to_next`,
// and receives one across `from_previous` (the posted receive, if one was posted for it).
// SendActivationValues throws std::invalid_argument for more than kMaxActivationDims
// dimensions; ReceiveActivationValues CommError for a malformed header.
void SendActivationValues(const at::Tensor& activation, const Crossing& to_next);
at::Tensor ReceiveActivationValues(const Crossing& from_previous);

// Sends `output` (floating point, requiring grad) to `to_next.peer` and returns the stage's
// terminal: a scalar whose backward() receives the gradient of `output` from the next stage
// and runs this stage's backward with it. Throws std::invalid_argument if `output` does not
// require grad (its backward could never run and the previous stages would wait forever) or
// has more than kMaxActivationDims dimensions.
at::Tensor SendActivation(const at::Tensor& output, const Crossing& to_next);

// Posts the receive of the gradient that `terminal` (SendActivation's) will wait for in its
// backward, ahead of that backward: where a one-stream backend needs it in its place
// (GradientReceivesAhead in schedule.h). Once per terminal at most; throws std::logic_error
// for a terminal that is not SendActivation's or whose backward already ran.
void PostGradientReceive(const at::Tensor& terminal);

}  // namespace gradhub::ddp::pipeline
