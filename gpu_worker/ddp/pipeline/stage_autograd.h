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
// - ReceiveActivation receives stage s's input (a shape header, then the values) and returns
//   it as a tensor whose grad_fn (A) SENDS the gradient of that input back to the previous
//   stage when stage s's backward reaches it.
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
#include <memory>
#include <mutex>
#include <vector>

#include "gpu_worker/ddp/comm/process_group.h"

namespace gradhub::ddp::pipeline {

// What a message between two stages carries: the low two bits of its tag.
enum class MessageKind : uint32_t {
  kActivationShape = 0,  // dtype and shape of the activation that follows
  kActivation = 1,       // a stage's output, to the next stage
  kGradient = 2,         // the gradient of that output, back to its sender
  kLoss = 3,             // the step's loss, from the last stage to stage 0 (boundary 0, mb 0)
};

inline constexpr int kMaxBoundaries = 1 << 12;
inline constexpr int kMaxMicroBatches = 1 << 18;
// An activation has at most this many dimensions (its shape header is fixed-size).
inline constexpr int kMaxActivationDims = 8;

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
// malformed shape header.
at::Tensor ReceiveActivation(const Crossing& from_previous);

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
