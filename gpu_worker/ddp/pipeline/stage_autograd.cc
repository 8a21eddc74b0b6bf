#include "gpu_worker/ddp/pipeline/stage_autograd.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>

#include <stdexcept>
#include <string>
#include <utility>

namespace gradhub::ddp::pipeline {
namespace {

using Clock = std::chrono::steady_clock;
using torch::autograd::variable_list;

// The activation header (see Activations in the header): {dtype, dims, size 0, ..., size 7,
// where, 0}, int64. 96 bytes, so that the values after it are aligned for every dtype. A
// kActivation message is an int64 tensor (a dtype every backend sends) of the header and the
// values' bytes, rounded up to whole int64s.
constexpr int64_t kHeaderLength = 4 + kMaxActivationDims;
constexpr int64_t kHeaderBytes = kHeaderLength * static_cast<int64_t>(sizeof(int64_t));
constexpr int64_t kWhere = 2 + kMaxActivationDims;
// Where an activation's values are: in its kActivation message, or in a kResizedActivation
// message after it.
constexpr int64_t kInline = 1;
constexpr int64_t kFollows = 2;

struct ActivationShape {
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> sizes;
  bool inline_values = false;
};

// The bytes of the values a link expects next: those of its last activation (none before one).
int64_t ExpectedBytes(const ActivationLink& link) {
  if (!link.crossed) return 0;
  int64_t elements = 1;
  for (int64_t size : link.sizes) elements *= size;
  return elements * static_cast<int64_t>(c10::elementSize(link.dtype));
}

at::Tensor EmptyMessage(int64_t value_bytes, c10::Device device) {
  const int64_t word = sizeof(int64_t);
  return at::empty({kHeaderLength + (value_bytes + word - 1) / word},
                   at::TensorOptions().dtype(at::kLong).device(device));
}

bool Expected(const ActivationLink& link, at::ScalarType dtype, at::IntArrayRef sizes) {
  return link.crossed && link.dtype == dtype && link.sizes == sizes;
}

void Remember(ActivationLink& link, at::ScalarType dtype, std::vector<int64_t> sizes) {
  link.crossed = true;
  link.dtype = dtype;
  link.sizes = std::move(sizes);
}

// A kActivation message for `activation`: the header, then its values when `inline_values`,
// else `expected_bytes` zeros (the size the receiver posted).
at::Tensor MakeMessage(const at::Tensor& activation, bool inline_values, int64_t expected_bytes) {
  std::vector<int64_t> header(kHeaderLength, 0);
  header[0] = static_cast<int64_t>(activation.scalar_type());
  header[1] = activation.dim();
  for (int64_t d = 0; d < activation.dim(); ++d) header[2 + d] = activation.size(d);
  header[kWhere] = inline_values ? kInline : kFollows;
  at::Tensor message = EmptyMessage(expected_bytes, activation.device());
  message.narrow(0, 0, kHeaderLength).copy_(at::tensor(header, at::kLong));
  at::Tensor values = message.narrow(0, kHeaderLength, message.numel() - kHeaderLength);
  if (!inline_values) {
    values.zero_();
  } else if (expected_bytes > 0) {
    if (expected_bytes % sizeof(int64_t) != 0) values[-1].zero_();  // the padding
    values.view(at::kByte)
        .narrow(0, 0, expected_bytes)
        .copy_(activation.reshape({-1}).view(at::kByte));
  }
  return message;
}

ActivationShape ReadHeader(const at::Tensor& message, const Crossing& from) {
  const at::Tensor header = message.narrow(0, 0, kHeaderLength).cpu();
  const int64_t* values = header.data_ptr<int64_t>();
  const auto malformed = [&](const std::string& what) {
    return CommError("pipeline: the activation header of micro-batch " +
                     std::to_string(from.micro_batch) + " from rank " + std::to_string(from.peer) +
                     " is malformed: " + what);
  };
  if (values[0] < 0 || values[0] >= static_cast<int64_t>(at::ScalarType::NumOptions)) {
    throw malformed("dtype " + std::to_string(values[0]));
  }
  if (values[1] < 0 || values[1] > kMaxActivationDims) {
    throw malformed(std::to_string(values[1]) + " dimensions");
  }
  if (values[kWhere] != kInline && values[kWhere] != kFollows) {
    throw malformed("where " + std::to_string(values[kWhere]));
  }
  ActivationShape shape{static_cast<at::ScalarType>(values[0]), {}, values[kWhere] == kInline};
  for (int64_t d = 0; d < values[1]; ++d) {
    if (values[2 + d] < 0) throw malformed("size " + std::to_string(values[2 + d]));
    shape.sizes.push_back(values[2 + d]);
  }
  return shape;
}

// grad_fn of a received activation (A in the header): sends the activation's gradient back
// to the stage it came from. No next edges: the rest of this backward runs on that stage.
class SendGradientBackward : public torch::autograd::Node {
 public:
  SendGradientBackward(Crossing from, const at::Tensor& activation)
      : from_(std::move(from)), sizes_(activation.sizes().vec()), options_(activation.options()) {}

  std::string name() const override { return "gradhub::pipeline::SendGradientBackward"; }

  variable_list apply(variable_list&& grads) override {
    at::Tensor grad = grads.empty() ? at::Tensor() : grads[0];
    // The sender waits for a gradient whatever this stage did with its input.
    grad = grad.defined() ? grad.to(options_).contiguous() : at::zeros(sizes_, options_);
    from_.traffic->Send(grad, from_.peer,
                        MessageTag(MessageKind::kGradient, from_.boundary, from_.micro_batch));
    return {};
  }

 private:
  const Crossing from_;
  const std::vector<int64_t> sizes_;
  const at::TensorOptions options_;
};

// grad_fn of a terminal (B in the header): receives the gradient of the sent output from the
// next stage and hands it to the output's own grad_fn. The terminal's incoming gradient (1
// from terminal.backward()) carries nothing and is ignored.
class ReceiveGradientBackward : public torch::autograd::Node {
 public:
  ReceiveGradientBackward(Crossing to, const at::Tensor& output)
      : to_(std::move(to)), sizes_(output.sizes().vec()), options_(output.options()) {}

  std::string name() const override { return "gradhub::pipeline::ReceiveGradientBackward"; }

  // Posts the receive now instead of when backward reaches this node.
  void PostReceive() {
    if (work_ || received_) {
      throw std::logic_error("pipeline: the gradient's receive was posted already");
    }
    gradient_ = at::empty(sizes_, options_);
    work_ = to_.traffic->PostReceive(
        gradient_, to_.peer, MessageTag(MessageKind::kGradient, to_.boundary, to_.micro_batch));
  }

  variable_list apply(variable_list&& /*grads*/) override {
    if (!work_) PostReceive();
    to_.traffic->WaitForReceive(*work_, gradient_);
    work_.reset();
    received_ = true;
    return {std::move(gradient_)};
  }

 private:
  const Crossing to_;
  const std::vector<int64_t> sizes_;
  const at::TensorOptions options_;
  std::shared_ptr<Work> work_;  // the gradient's receive, once posted
  at::Tensor gradient_;         // where it lands
  bool received_ = false;
};

}  // namespace

uint32_t MessageTag(MessageKind kind, int boundary, int micro_batch) {
  if (boundary < 0 || boundary >= kMaxBoundaries) {
    throw std::invalid_argument("pipeline message tag: boundary " + std::to_string(boundary) +
                                " is not in [0, " + std::to_string(kMaxBoundaries) + ")");
  }
  if (micro_batch < 0 || micro_batch >= kMaxMicroBatches) {
    throw std::invalid_argument("pipeline message tag: micro_batch " + std::to_string(micro_batch) +
                                " is not in [0, " + std::to_string(kMaxMicroBatches) + ")");
  }
  return static_cast<uint32_t>(kind) | static_cast<uint32_t>(boundary) << 2 |
         static_cast<uint32_t>(micro_batch) << 14;
}

StageTraffic::StageTraffic(std::shared_ptr<ProcessGroup> group, c10::Device device)
    : group_(std::move(group)), device_(device) {}

StageTraffic::~StageTraffic() = default;

void StageTraffic::Send(at::Tensor tensor, int dst, uint32_t tag) {
  const auto start = Clock::now();
  std::shared_ptr<Work> work = group_->Send(tensor, dst, tag);
  std::lock_guard<std::mutex> lock(mu_);
  totals_.bytes_sent += static_cast<int64_t>(tensor.nbytes());
  pending_.push_back({std::move(work), std::move(tensor)});
  totals_.send += Clock::now() - start;
}

void StageTraffic::Receive(const at::Tensor& tensor, int src, uint32_t tag) {
  WaitForReceive(*PostReceive(tensor, src, tag), tensor);
}

std::shared_ptr<Work> StageTraffic::PostReceive(const at::Tensor& tensor, int src, uint32_t tag) {
  return group_->Recv(tensor, src, tag);
}

void StageTraffic::WaitForReceive(Work& work, const at::Tensor& tensor) {
  const auto start = Clock::now();
  work.Wait();
  std::lock_guard<std::mutex> lock(mu_);
  totals_.bytes_received += static_cast<int64_t>(tensor.nbytes());
  totals_.receive_wait += Clock::now() - start;
}

void StageTraffic::ReleaseCompletedSends() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<PendingSend> still;
  for (PendingSend& send : pending_) {
    if (!send.work->IsCompleted()) {
      still.push_back(std::move(send));
    } else if (std::exception_ptr error = send.work->error()) {
      std::rethrow_exception(error);
    }
  }
  pending_ = std::move(still);
}

void StageTraffic::WaitForSends() {
  std::vector<PendingSend> sends;
  {
    std::lock_guard<std::mutex> lock(mu_);
    sends.swap(pending_);
  }
  const auto start = Clock::now();
  for (PendingSend& send : sends) send.work->Wait();
  std::lock_guard<std::mutex> lock(mu_);
  totals_.send += Clock::now() - start;
}

StageTraffic::Totals StageTraffic::totals() const {
  std::lock_guard<std::mutex> lock(mu_);
  return totals_;
}

int64_t StageTraffic::sends_in_flight() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(pending_.size());
}

ActivationLink& StageTraffic::Link(bool sending, int peer, int boundary) {
  std::lock_guard<std::mutex> lock(mu_);
  return links_[{sending, peer, boundary}];
}

void PostActivationReceive(const Crossing& from) {
  StageTraffic& traffic = *from.traffic;
  ActivationLink& link = traffic.Link(/*sending=*/false, from.peer, from.boundary);
  if (link.posted) {
    throw std::logic_error("pipeline: the activation of micro-batch " +
                           std::to_string(link.posted_micro_batch) + " across boundary " +
                           std::to_string(from.boundary) + " is posted already");
  }
  link.message = EmptyMessage(ExpectedBytes(link), traffic.device());
  link.posted =
      traffic.PostReceive(link.message, from.peer,
                          MessageTag(MessageKind::kActivation, from.boundary, from.micro_batch));
  link.posted_micro_batch = from.micro_batch;
}

at::Tensor ReceiveActivationValues(const Crossing& from) {
  StageTraffic& traffic = *from.traffic;
  ActivationLink& link = traffic.Link(/*sending=*/false, from.peer, from.boundary);
  if (!link.posted) PostActivationReceive(from);
  if (link.posted_micro_batch != from.micro_batch) {
    throw std::logic_error("pipeline: micro-batch " + std::to_string(from.micro_batch) +
                           " received across boundary " + std::to_string(from.boundary) +
                           " while micro-batch " + std::to_string(link.posted_micro_batch) +
                           "'s receive is posted");
  }
  const std::shared_ptr<Work> work = std::move(link.posted);
  const at::Tensor message = std::move(link.message);
  link.posted_micro_batch = -1;
  traffic.WaitForReceive(*work, message);
  ActivationShape shape = ReadHeader(message, from);
  const auto options = at::TensorOptions().dtype(shape.dtype).device(traffic.device());
  at::Tensor values;
  if (!shape.inline_values) {
    values = at::empty(shape.sizes, options);
    traffic.Receive(values, from.peer,
                    MessageTag(MessageKind::kResizedActivation, from.boundary, from.micro_batch));
  } else if (Expected(link, shape.dtype, shape.sizes)) {
    // The values in place: the message's storage stays alive as long as they do.
    values = at::from_blob(
        static_cast<uint8_t*>(message.data_ptr()) + kHeaderBytes, shape.sizes, [message](void*) {},
        options);
  } else {
    throw CommError("pipeline: rank " + std::to_string(from.peer) + " sent micro-batch " +
                    std::to_string(from.micro_batch) +
                    "'s values inline, but not in the shape this rank expected");
  }
  Remember(link, shape.dtype, std::move(shape.sizes));
  return values;
}

void SendActivationValues(const at::Tensor& activation, const Crossing& to) {
  if (activation.dim() > kMaxActivationDims) {
    throw std::invalid_argument("pipeline: the stage's output has " +
                                std::to_string(activation.dim()) + " dimensions; at most " +
                                std::to_string(kMaxActivationDims) + " can be sent");
  }
  StageTraffic& traffic = *to.traffic;
  ActivationLink& link = traffic.Link(/*sending=*/true, to.peer, to.boundary);
  const at::Tensor payload = activation.contiguous();
  const bool inline_values = Expected(link, payload.scalar_type(), payload.sizes());
  traffic.Send(MakeMessage(payload, inline_values, ExpectedBytes(link)), to.peer,
               MessageTag(MessageKind::kActivation, to.boundary, to.micro_batch));
  if (!inline_values) {
    traffic.Send(payload, to.peer,
                 MessageTag(MessageKind::kResizedActivation, to.boundary, to.micro_batch));
  }
  Remember(link, payload.scalar_type(), payload.sizes().vec());
}

at::Tensor ReceiveActivation(const Crossing& from) {
  const at::Tensor received = ReceiveActivationValues(from);
  if (!at::isFloatingType(received.scalar_type())) {
    throw CommError(std::string("pipeline: rank ") + std::to_string(from.peer) + " sent a " +
                    c10::toString(received.scalar_type()) +
                    " activation; only floating point activations carry gradients");
  }
  // The history goes on an alias: the group's transfer may still hold `received` for a
  // moment, and must never be the one to drop the last reference to the node (which holds
  // the traffic, and so the group: a group destroyed on its own thread would join itself).
  at::Tensor activation = received.detach();
  torch::autograd::set_history(
      activation, std::shared_ptr<SendGradientBackward>(new SendGradientBackward(from, activation),
                                                        torch::autograd::deleteNode));
  return activation;
}

at::Tensor SendActivation(const at::Tensor& output, const Crossing& to_next) {
  if (!output.requires_grad()) {
    throw std::invalid_argument(
        "pipeline: the stage's output does not require grad, so its backward could never run "
        "and the previous stages would wait for its gradient");
  }
  SendActivationValues(output.detach(), to_next);
  auto node = std::shared_ptr<ReceiveGradientBackward>(new ReceiveGradientBackward(to_next, output),
                                                       torch::autograd::deleteNode);
  node->set_next_edges(torch::autograd::collect_next_edges(output));
  at::Tensor terminal = at::zeros({}, output.options());
  torch::autograd::set_history(terminal, node);
  return terminal;
}

void PostGradientReceive(const at::Tensor& terminal) {
  auto* node = dynamic_cast<ReceiveGradientBackward*>(terminal.grad_fn().get());
  if (node == nullptr) {
    throw std::logic_error("pipeline: PostGradientReceive needs a terminal of SendActivation");
  }
  node->PostReceive();
}

}  // namespace gradhub::ddp::pipeline
