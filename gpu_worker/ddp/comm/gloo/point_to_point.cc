#include "gpu_worker/ddp/comm/gloo/point_to_point.h"

#include <gloo/context.h>
#include <gloo/transport/unbound_buffer.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
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

constexpr uint64_t kHeaderSlotPrefix = 0x80;
constexpr uint64_t kPayloadSlotPrefix = 0x81;
constexpr uint64_t kLow56Bits = (uint64_t{1} << 56) - 1;
constexpr uint32_t kHeaderMagic = 0x47503250;  // "P2PG"

// What a transfer's header says about its payload. Both ends are the same build, so the dtype
// travels as ATen's enum value.
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

bool SameSize(const WireHeader& a, const WireHeader& b) {
  return a.bytes == b.bytes && a.elements == b.elements && a.dtype == b.dtype;
}

// Whether the payload of a transfer of this size rides in its header's message.
bool Inline(const WireHeader& header) { return header.bytes <= kPointToPointInlineMaxBytes; }

std::string SizeOf(const WireHeader& header) {
  return StrCat(header.elements, " ", detail::DtypeName(static_cast<at::ScalarType>(header.dtype)),
                " elements (", header.bytes, " bytes)");
}

// splitmix64's finaliser: every input bit moves about half of the output bits.
uint64_t Mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
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

// One posted message: gloo's buffer, and the bytes it sends or receives in place of the
// tensor's when they are not the tensor's own (sealed, or a header with its payload inline);
// gloo reads or writes them until the message completes.
struct Posted {
  std::unique_ptr<uint8_t[]> staged;
  std::unique_ptr<gloo::transport::UnboundBuffer> buffer;
};

}  // namespace

uint64_t PointToPointSlot(uint32_t tag, uint64_t index) {
  return (kHeaderSlotPrefix << 56) | (static_cast<uint64_t>(tag) << 24) | (index & 0xffffff);
}

uint64_t PointToPointPayloadSlot(uint32_t tag, uint64_t index, uint64_t bytes, int64_t elements,
                                 int32_t dtype) {
  const uint64_t place = (static_cast<uint64_t>(tag) << 24) | (index & 0xffffff);
  uint64_t size = Mix(bytes);
  size = Mix(size ^ static_cast<uint64_t>(elements));
  size = Mix(size ^ static_cast<uint32_t>(dtype));
  size = Mix(size ^ (index >> 24));
  return (kPayloadSlotPrefix << 56) | ((place ^ size) & kLow56Bits);
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
  std::unique_ptr<DirectionCipher> cipher;  // null unless the group encrypts
  // The sender's header, or the header the receiver expects; then what arrived.
  WireHeader header;
  WireHeader arrived;
  Posted head, body;
  bool claimed = false;  // guarded by FinishClaims: steps 2 to 4 have a thread

  uint64_t PayloadSlot(const WireHeader& size) const {
    return PointToPointPayloadSlot(tag, index, size.bytes, size.elements, size.dtype);
  }
  // The nonce label of its header or payload (traffic_sealing.h).
  MessageLabel Label(bool payload) const {
    return MessageLabel{2 * index + (payload ? 1 : 0), tag};
  }
  size_t WireBytes(size_t plain_bytes) const {
    return cipher != nullptr ? plain_bytes + kSealTagBytes : plain_bytes;
  }
  // The header as it travels; an inline payload follows it in the same message.
  size_t HeadWireBytes() const { return WireBytes(sizeof(WireHeader)); }

  // Writes `bytes` of `plain` to `wire` as they travel: sealed when the group encrypts.
  void Stage(bool payload, const void* plain, size_t bytes, uint8_t* wire) const {
    if (cipher != nullptr) {
      cipher->Seal(Label(payload), plain, bytes, wire);
    } else {
      std::memcpy(wire, plain, bytes);
    }
  }

  // The reverse of Stage, into `plain`.
  void Unstage(bool payload, const uint8_t* wire, void* plain, size_t bytes) const {
    if (cipher == nullptr) {
      std::memcpy(plain, wire, bytes);
    } else if (!cipher->Open(Label(payload), wire, bytes, plain)) {
      throw TrafficAuthenticationError(peer);
    }
  }

  // The header's message from the sender: the header, then the payload when it rides inline,
  // each staged on its own (so that each is sealed under its own label).
  Posted PostHeadSend(uint64_t slot) const {
    const size_t head_bytes = HeadWireBytes();
    const size_t payload_bytes = Inline(header) && header.bytes > 0 ? WireBytes(header.bytes) : 0;
    Posted posted;
    posted.staged = Uninitialised(head_bytes + payload_bytes);
    Stage(false, &header, sizeof(header), posted.staged.get());
    if (payload_bytes > 0) {
      Stage(true, tensor.data_ptr(), header.bytes, posted.staged.get() + head_bytes);
    }
    posted.buffer = context->createUnboundBuffer(posted.staged.get(), head_bytes + payload_bytes);
    posted.buffer->send(peer, slot);
    return posted;
  }

  // A payload too large to ride inline, on the slot of its size: straight from the tensor, or
  // from a sealed copy.
  Posted PostPayloadSend() const {
    Posted posted;
    void* wire = tensor.data_ptr();
    if (cipher != nullptr) {
      posted.staged = Uninitialised(WireBytes(header.bytes));
      Stage(true, tensor.data_ptr(), header.bytes, posted.staged.get());
      wire = posted.staged.get();
    }
    posted.buffer = context->createUnboundBuffer(wire, WireBytes(header.bytes));
    posted.buffer->send(peer, PayloadSlot(header));
    return posted;
  }

  // The receive of the header's message: room for the largest that may come, a header with an
  // inline payload, whatever size this rank expects (gloo takes a message shorter than the
  // receive, never a longer one).
  Posted PostHeadRecv(uint64_t slot) const {
    const size_t capacity = HeadWireBytes() + WireBytes(kPointToPointInlineMaxBytes);
    Posted posted;
    posted.staged = Uninitialised(capacity);
    posted.buffer = context->createUnboundBuffer(posted.staged.get(), capacity);
    posted.buffer->recv(peer, slot);
    return posted;
  }

  // Receives a payload of `size` on its slot: into `target`, or when the group encrypts into
  // a sealed buffer that Unstage opens.
  Posted PostPayloadRecv(void* target, const WireHeader& size) const {
    Posted posted;
    if (cipher != nullptr) {
      posted.staged = Uninitialised(WireBytes(size.bytes));
      target = posted.staged.get();
    }
    posted.buffer = context->createUnboundBuffer(target, WireBytes(size.bytes));
    posted.buffer->recv(peer, PayloadSlot(size));
    return posted;
  }

  // Step 1: the messages go to gloo on the caller's thread. A sealed payload that does not ride
  // inline is sealed in step 2, on the transfer's thread: AES-GCM runs at 1-2 GB/s, so sealing
  // a 25 MiB activation would hold up the caller for ~15 ms.
  void Post() {
    header = HeaderOf(tensor);
    const uint64_t head_slot = PointToPointSlot(tag, index);
    if (sending) {
      head = PostHeadSend(head_slot);
      if (!Inline(header) && cipher == nullptr) body = PostPayloadSend();
      return;
    }
    head = PostHeadRecv(head_slot);
    if (!Inline(header)) body = PostPayloadRecv(tensor.data_ptr(), header);
  }

  // Step 2.
  void FinishSend() {
    if (!Inline(header) && !body.buffer) body = PostPayloadSend();
    AwaitSend(*head.buffer, deadline);
    if (body.buffer) AwaitSend(*body.buffer, deadline);
  }

  // Step 3.
  void FinishRecv() {
    AwaitRecv(*head.buffer, deadline);
    Unstage(false, head.staged.get(), &arrived, sizeof(arrived));
    if (arrived.magic != kHeaderMagic) {
      throw CommError(StrCat("malformed point-to-point header from rank ", peer));
    }
    if (SameSize(arrived, header)) {
      if (Inline(header)) {
        if (header.bytes > 0) {
          Unstage(true, head.staged.get() + HeadWireBytes(), tensor.data_ptr(), header.bytes);
        }
        return;
      }
      AwaitRecv(*body.buffer, deadline);
      if (body.staged) Unstage(true, body.staged.get(), tensor.data_ptr(), header.bytes);
      return;
    }
    // A payload too large to ride inline went to the slot of its own size: take it from there
    // into scratch. A receive posted for the expected size stays posted in gloo, its buffer
    // gone.
    if (!Inline(arrived)) {
      std::unique_ptr<uint8_t[]> scratch = Uninitialised(arrived.bytes);
      Posted sent = PostPayloadRecv(scratch.get(), arrived);
      AwaitRecv(*sent.buffer, deadline);
    }
    throw SizeMismatch(StrCat("size mismatch: rank ", peer, " sent ", SizeOf(arrived),
                              ", this rank expects ", SizeOf(header)));
  }
};

// Who runs a transfer's steps 2 to 4: the first thread to claim it, its task thread or one that
// waits for its Work (see the class comment). Shared with the Works, which may outlive the
// GlooPointToPoint: a waiter uses the owner only between its claim and its end, and Close()
// lets no claim begin after it and waits for those in progress.
class GlooPointToPoint::FinishClaims {
 public:
  explicit FinishClaims(GlooPointToPoint* owner) : owner_(owner) {}

  bool ClaimForTaskThread(Transfer& transfer) {
    std::lock_guard<std::mutex> lock(mu_);
    return !std::exchange(transfer.claimed, true);
  }

  // Runs steps 2 to 4 on the calling thread if it claims the transfer; else returns at once.
  void FinishOnWaiter(const std::weak_ptr<Transfer>& weak) {
    const std::shared_ptr<Transfer> transfer = weak.lock();  // none: it ended, its task is gone
    if (transfer == nullptr) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (closed_ || transfer->claimed) return;
      transfer->claimed = true;
      ++finishing_;
    }
    owner_->Finish(*transfer);
    std::lock_guard<std::mutex> lock(mu_);
    if (--finishing_ == 0) idle_.notify_all();
  }

  void Close() {
    std::unique_lock<std::mutex> lock(mu_);
    closed_ = true;
    idle_.wait(lock, [this] { return finishing_ == 0; });
  }

 private:
  GlooPointToPoint* const owner_;  // used only by claims made before Close()
  std::mutex mu_;
  std::condition_variable idle_;
  bool closed_ = false;  // guarded by mu_
  int finishing_ = 0;    // guarded by mu_: waiters running steps 2 to 4
};

GlooPointToPoint::GlooPointToPoint(Setup setup)
    : setup_(std::move(setup)),
      claims_(std::make_shared<FinishClaims>(this)),
      threads_(setup_.group->name().substr(0, 6) + "-p2p") {}

// Waiters first (they may use anything of this object); then the task threads, as members go.
GlooPointToPoint::~GlooPointToPoint() { claims_->Close(); }

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
  work->MarkStarted();
  try {
    transfer->cipher = CipherFor(*transfer);
    transfer->Post();
  } catch (...) {
    Fail(*transfer, std::current_exception());
    return work;
  }
  work->LetWaiterFinish([claims = claims_, weak = std::weak_ptr<Transfer>(transfer)] {
    claims->FinishOnWaiter(weak);
  });
  threads_.Run([this, transfer] {
    if (claims_->ClaimForTaskThread(*transfer)) Finish(*transfer);
  });
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

void GlooPointToPoint::Finish(Transfer& transfer) {
  try {
    if (transfer.sending) {
      transfer.FinishSend();
    } else {
      transfer.FinishRecv();
    }
    transfer.work->Complete();
  } catch (...) {
    Fail(transfer, std::current_exception());
  }
}

void GlooPointToPoint::Fail(const Transfer& transfer, std::exception_ptr error) {
  const std::shared_ptr<Work>& work = transfer.work;
  try {
    std::rethrow_exception(error);
  } catch (const SizeMismatch& e) {
    work->Complete(std::make_exception_ptr(CommError(work->description() + ": " + e.what())));
  } catch (...) {
    const std::string message =
        work->description() + ": " + GlooFailureReason(error, setup_.timeout);
    setup_.health->MarkBroken(message);
    work->Complete(std::make_exception_ptr(CommError(message)));
  }
}

}  // namespace gradhub::ddp
