#include "gpu_worker/ddp/comm/gloo/point_to_point.h"

#include <gloo/context.h>
#include <gloo/transport/unbound_buffer.h>

#include <algorithm>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>

#include "gpu_worker/ddp/comm/checks.h"
#include "gpu_worker/ddp/comm/collective_checks.h"
#include "gpu_worker/ddp/comm/gloo/gloo_failure.h"

namespace gradhub::ddp {
namespace {

using Clock = std::chrono::steady_clock;
using detail::StrCat;

constexpr uint8_t kHeaderSlotPrefix = 0x80;
constexpr uint8_t kPayloadSlotPrefix = 0x81;
constexpr uint32_t kHeaderMagic = 0x47503250;  // "P2PG"

// What a transfer's header says about its payload (protocol step 2). Both ends are the same
// build, so the dtype travels as ATen's enum value.
struct WireHeader {
  uint64_t bytes = 0;
  int64_t elements = 0;
  int32_t dtype = 0;
  uint32_t magic = kHeaderMagic;
};
static_assert(sizeof(WireHeader) == 24, "the header's layout is part of the wire format");

WireHeader HeaderOf(const at::Tensor& tensor) {
  WireHeader header;
  header.bytes = tensor.nbytes();
  header.elements = tensor.numel();
  header.dtype = static_cast<int32_t>(tensor.scalar_type());
  return header;
}

std::string SizeOf(const WireHeader& header) {
  return StrCat(header.elements, " ", detail::DtypeName(static_cast<at::ScalarType>(header.dtype)),
                " elements (", header.bytes, " bytes)");
}

// Step 3's refusal: fails the one Work and leaves the group usable.
class SizeMismatch : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

void AwaitSend(gloo::transport::UnboundBuffer& buffer, Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  if (!buffer.waitSend(std::max(left, std::chrono::milliseconds(1)))) {
    throw CommError("the send was aborted");
  }
}

void AwaitRecv(gloo::transport::UnboundBuffer& buffer, Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  if (!buffer.waitRecv(std::max(left, std::chrono::milliseconds(1)))) {
    throw CommError("the receive was aborted");
  }
}

// A buffer left uninitialised: every byte of it is written (sealed, or received) before it
// is read, and zeroing 25 MiB first would cost as much as a memcpy of it.
std::unique_ptr<uint8_t[]> Uninitialised(size_t bytes) {
  return std::unique_ptr<uint8_t[]>(new uint8_t[bytes]);
}

// The bytes one message puts on the wire: the plaintext itself, or a sealed copy of it.
struct Outgoing {
  std::unique_ptr<uint8_t[]> sealed;
  void* data = nullptr;
  size_t bytes = 0;
};

}  // namespace

uint64_t PointToPointSlot(bool payload, uint32_t tag, uint64_t index) {
  const uint64_t prefix = payload ? kPayloadSlotPrefix : kHeaderSlotPrefix;
  return (prefix << 56) | (static_cast<uint64_t>(tag) << 24) | (index & 0xffffff);
}

struct GlooPointToPoint::Transfer {
  bool sending = false;
  at::Tensor tensor;
  int peer = 0;
  uint32_t tag = 0;
  uint64_t index = 0;  // k
  std::shared_ptr<Work> work;
  gloo::Context* context = nullptr;
  Clock::time_point deadline;

  uint64_t Slot(bool payload) const { return PointToPointSlot(payload, tag, index); }
  // The nonce label of its header or payload (traffic_sealing.h).
  MessageLabel Label(bool payload) const {
    return MessageLabel{2 * index + (payload ? 1 : 0), tag};
  }

  Outgoing Prepare(DirectionCipher* cipher, bool payload, const void* plain, size_t bytes) const {
    Outgoing out;
    if (cipher == nullptr) {
      out.data = const_cast<void*>(plain);
      out.bytes = bytes;
      return out;
    }
    out.bytes = bytes + kSealTagBytes;
    out.sealed = Uninitialised(out.bytes);
    cipher->Seal(Label(payload), plain, bytes, out.sealed.get());
    out.data = out.sealed.get();
    return out;
  }

  // Step 2.
  void Send(DirectionCipher* cipher) const {
    const WireHeader header = HeaderOf(tensor);
    const Outgoing head = Prepare(cipher, false, &header, sizeof(header));
    auto head_buffer = context->createUnboundBuffer(head.data, head.bytes);
    head_buffer->send(peer, Slot(false));
    std::unique_ptr<gloo::transport::UnboundBuffer> body_buffer;
    Outgoing body;
    if (header.bytes > 0) {
      body = Prepare(cipher, true, tensor.data_ptr(), header.bytes);
      body_buffer = context->createUnboundBuffer(body.data, body.bytes);
      body_buffer->send(peer, Slot(true));
    }
    AwaitSend(*head_buffer, deadline);
    if (body_buffer) AwaitSend(*body_buffer, deadline);
  }

  // Receives one message of `bytes` plaintext bytes into `target`, opening it when sealed.
  void ReceiveInto(DirectionCipher* cipher, bool payload, void* target, size_t bytes) const {
    const size_t wire_bytes = cipher != nullptr ? bytes + kSealTagBytes : bytes;
    std::unique_ptr<uint8_t[]> sealed = cipher != nullptr ? Uninitialised(wire_bytes) : nullptr;
    auto buffer =
        context->createUnboundBuffer(cipher != nullptr ? sealed.get() : target, wire_bytes);
    buffer->recv(peer, Slot(payload));
    AwaitRecv(*buffer, deadline);
    if (cipher != nullptr && !cipher->Open(Label(payload), sealed.get(), bytes, target)) {
      throw TrafficAuthenticationError(peer);
    }
  }

  // Step 3.
  void Receive(DirectionCipher* cipher) const {
    WireHeader sent;
    ReceiveInto(cipher, false, &sent, sizeof(sent));
    if (sent.magic != kHeaderMagic) {
      throw CommError(StrCat("malformed point-to-point header from rank ", peer));
    }
    const WireHeader expected = HeaderOf(tensor);
    const bool match = sent.bytes == expected.bytes && sent.elements == expected.elements &&
                       sent.dtype == expected.dtype;
    std::unique_ptr<uint8_t[]> scratch = match ? nullptr : Uninitialised(sent.bytes);
    if (sent.bytes > 0) {
      ReceiveInto(cipher, true, match ? tensor.data_ptr() : scratch.get(), sent.bytes);
    }
    if (!match) {
      throw SizeMismatch(StrCat("size mismatch: rank ", peer, " sent ", SizeOf(sent),
                                ", this rank expects ", SizeOf(expected)));
    }
  }
};

GlooPointToPoint::GlooPointToPoint(Setup setup)
    : setup_(std::move(setup)), threads_(setup_.group->name().substr(0, 6) + "-p2p") {}

GlooPointToPoint::~GlooPointToPoint() = default;

std::shared_ptr<Work> GlooPointToPoint::Send(at::Tensor tensor, int dst, uint32_t tag) {
  return Issue(/*sending=*/true, std::move(tensor), dst, tag);
}

std::shared_ptr<Work> GlooPointToPoint::Recv(at::Tensor tensor, int src, uint32_t tag) {
  return Issue(/*sending=*/false, std::move(tensor), src, tag);
}

std::shared_ptr<Work> GlooPointToPoint::Issue(bool sending, at::Tensor tensor, int peer,
                                              uint32_t tag) {
  const ProcessGroup& group = *setup_.group;
  const detail::CheckedCollective checked =
      detail::CheckPointToPoint(group, c10::Device(c10::kCPU), sending, tensor, peer, tag);
  auto transfer = std::make_shared<Transfer>();
  transfer->sending = sending;
  transfer->tensor = std::move(tensor);
  transfer->peer = peer;
  transfer->tag = tag;
  transfer->context = setup_.contexts[tag % setup_.contexts.size()].get();
  transfer->deadline = Clock::now() + setup_.timeout;
  {
    std::lock_guard<std::mutex> lock(mu_);
    transfer->index = next_index_[{sending, peer, tag}]++;
  }
  transfer->work = std::make_shared<Work>(
      detail::DescribeCollective(group, sending ? "send" : "recv", transfer->index, checked.detail),
      setup_.timeout);
  std::shared_ptr<Work> work = transfer->work;
  if (setup_.health->broken()) {
    work->Complete(setup_.health->UnusableError(work->description(), group.name()));
    return work;
  }
  threads_.Run([this, transfer] { Run(*transfer); });
  return work;
}

std::unique_ptr<DirectionCipher> GlooPointToPoint::CipherFor(const Transfer& transfer) const {
  if (!setup_.key) return nullptr;
  const int self = setup_.group->rank();
  TrafficDirection direction{setup_.group->name(), kPointToPointChannel,
                             transfer.sending ? self : transfer.peer,
                             transfer.sending ? transfer.peer : self};
  return std::make_unique<DirectionCipher>(*setup_.key, std::move(direction));
}

void GlooPointToPoint::Run(const Transfer& transfer) {
  const std::shared_ptr<Work>& work = transfer.work;
  if (setup_.health->broken()) {
    work->Complete(setup_.health->UnusableError(work->description(), setup_.group->name()));
    return;
  }
  work->MarkStarted();
  try {
    const std::unique_ptr<DirectionCipher> cipher = CipherFor(transfer);
    if (transfer.sending) {
      transfer.Send(cipher.get());
    } else {
      transfer.Receive(cipher.get());
    }
    work->Complete();
  } catch (const SizeMismatch& e) {
    work->Complete(std::make_exception_ptr(CommError(work->description() + ": " + e.what())));
  } catch (...) {
    const std::string message =
        work->description() + ": " + GlooFailureReason(std::current_exception(), setup_.timeout);
    setup_.health->MarkBroken(message);
    work->Complete(std::make_exception_ptr(CommError(message)));
  }
}

}  // namespace gradhub::ddp
