#include "gpu_worker/ddp/comm/gloo/sealed_channel.h"

#include <gloo/context.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <utility>

#include "gpu_worker/ddp/comm/work.h"

namespace gradhub::ddp {
namespace {

using Clock = std::chrono::steady_clock;

// gloo's own collectives use slot prefixes 0x01 to 0x08 (gloo/types.h).
constexpr uint8_t kSealedSlotPrefix = 0x47;

std::string Mismatch(bool own, int rank, bool theirs) {
  auto name = [](bool value) { return value ? "true" : "false"; };
  return std::string(
             "ranks disagree on GlooOptions::encrypt_traffic (a job's "
             "distributed.encryptTraffic): rank 0 has ") +
         name(own) + ", rank " + std::to_string(rank) + " has " + name(theirs);
}

// Step 2 of the agreement, on rank 0.
std::string Verdict(const TrafficKeyAgreement::Options& options) {
  for (int r = 1; r < options.size; ++r) {
    const std::string key = options.prefix + "encrypt/" + std::to_string(r);
    const bool theirs = options.store->Get(key, options.timeout) == "1";
    if (theirs != options.encrypt) return "!" + Mismatch(options.encrypt, r, theirs);
  }
  if (!options.encrypt) return "plain";
  const TrafficKey key = DrawTrafficKey();
  return "key:" + std::string(key.begin(), key.end());
}

std::optional<TrafficKey> ParseVerdict(const std::string& verdict) {
  if (verdict == "plain") return std::nullopt;
  if (!verdict.empty() && verdict[0] == '!') throw CommError(verdict.substr(1));
  const std::string prefix = "key:";
  if (verdict.size() != prefix.size() + kTrafficKeyBytes || verdict.rfind(prefix, 0) != 0) {
    throw CommError("malformed traffic-key verdict in the store (" +
                    std::to_string(verdict.size()) + " bytes)");
  }
  TrafficKey key{};
  std::memcpy(key.data(), verdict.data() + prefix.size(), kTrafficKeyBytes);
  return key;
}

}  // namespace

std::optional<TrafficKey> TrafficKeyAgreement::Establish(const Options& options) {
  if (options.rank != 0) {
    options.store->Set(options.prefix + "encrypt/" + std::to_string(options.rank),
                       options.encrypt ? "1" : "0");
    return ParseVerdict(options.store->Get(options.prefix + "verdict", options.timeout));
  }
  const std::string verdict = Verdict(options);
  options.store->Set(options.prefix + "verdict", verdict);
  return ParseVerdict(verdict);
}

// The memory messages pass through: kWindow send slots and kWindow receive slots of a chunk
// and its tag each, gloo's unbound buffers over them, and a chunk of scratch to open into.
struct SealedChannel::Staging {
  explicit Staging(gloo::Context& context)
      : send_area(kWindow * kSlotBytes),
        recv_area(kWindow * kSlotBytes),
        scratch(kChunkBytes),
        send(context.createUnboundBuffer(send_area.data(), send_area.size())),
        recv(context.createUnboundBuffer(recv_area.data(), recv_area.size())) {}

  static constexpr size_t kSlotBytes = kChunkBytes + kSealTagBytes;
  static size_t Offset(size_t message) { return (message % kWindow) * kSlotBytes; }

  std::vector<uint8_t> send_area, recv_area, scratch;
  // After the areas: destroyed before them.
  std::unique_ptr<gloo::transport::UnboundBuffer> send, recv;
};

// One collective's run of a plan: protocol steps 1 to 3 of the header.
class SealedChannel::Pipeline {
 public:
  struct Ends {
    DirectionCipher* sealer = nullptr;  // towards plan.send_to
    DirectionCipher* opener = nullptr;  // from plan.recv_from
    const detail::ReduceKernel* kernel = nullptr;
    int group_size = 1;
  };

  Pipeline(Staging& staging, const ExchangePlan& plan, Ends ends, uint64_t collective,
           std::chrono::milliseconds timeout)
      : staging_(staging),
        plan_(plan),
        ends_(ends),
        collective_(collective),
        slot_(gloo::Slot::build(kSealedSlotPrefix, static_cast<uint32_t>(collective))),
        deadline_(Clock::now() + timeout) {}

  void Run() {
    for (const ExchangeStep& step : plan_.steps) {
      if (step.send) sends_.push_back(&*step.send);
      if (step.recv) recv_bytes_.push_back(step.recv->bytes);
    }
    for (size_t k = 0; k < std::min(kWindow, recv_bytes_.size()); ++k) PostReceive(k);
    size_t due = 0;  // sends of the steps begun so far
    for (const ExchangeStep& step : plan_.steps) {
      if (step.send) ++due;
      while (sent_ < due) Send(*sends_[sent_]);
      // Step 2a's sends ahead: up to kWindow - 1 past this step's, each once its bytes are
      // final. A wait for a free slot here needs the peer to have consumed a message of an
      // earlier step, never a later one, so ranks that all do this cannot wait on each other.
      while (sent_ < sends_.size() && sent_ + 1 < due + kWindow &&
             sends_[sent_]->after_receives <= received_) {
        Send(*sends_[sent_]);
      }
      if (step.recv) Receive(*step.recv);
    }
    while (completed_sends_ < sent_) WaitSend();
  }

 private:
  std::chrono::milliseconds Left() const {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline_ - Clock::now());
    return std::max(left, std::chrono::milliseconds(1));
  }

  MessageLabel Label(size_t message) const {
    return MessageLabel{collective_, static_cast<uint32_t>(message)};
  }

  void PostReceive(size_t message) {
    staging_.recv->recv(plan_.recv_from, slot_, Staging::Offset(message),
                        recv_bytes_[message] + kSealTagBytes);
  }

  void WaitSend() {
    if (!staging_.send->waitSend(Left())) throw CommError("a sealed send was aborted");
    ++completed_sends_;
  }

  // Step 2a.
  void Send(const OutgoingChunk& chunk) {
    if (sent_ - completed_sends_ == kWindow) WaitSend();
    const size_t offset = Staging::Offset(sent_);
    ends_.sealer->Seal(Label(sent_), chunk.plain, chunk.bytes, staging_.send_area.data() + offset);
    staging_.send->send(plan_.send_to, slot_, offset, chunk.bytes + kSealTagBytes);
    ++sent_;
  }

  // Step 2b.
  void Receive(const IncomingChunk& chunk) {
    if (!staging_.recv->waitRecv(Left())) throw CommError("a sealed receive was aborted");
    const size_t message = received_;
    // A chunk to reduce is opened into scratch: not one element of it is reduced before its
    // tag checked out. One that only overwrites its place is opened straight into it (a copy
    // less); if it fails, the output holds unspecified bytes, as after any failed collective.
    uint8_t* opened = chunk.reduce ? staging_.scratch.data() : chunk.target;
    if (!ends_.opener->Open(Label(message), staging_.recv_area.data() + Staging::Offset(message),
                            chunk.bytes, opened)) {
      throw TrafficAuthenticationError(plan_.recv_from);
    }
    if (chunk.reduce) {
      const detail::ReduceKernel& kernel = *ends_.kernel;
      const size_t count = chunk.bytes / kernel.element_size;
      kernel.reduce(chunk.target, chunk.target, opened, count);
      if (chunk.complete && kernel.divide != nullptr) {
        kernel.divide(chunk.target, count, ends_.group_size);
      }
    }
    ++received_;
    if (message + kWindow < recv_bytes_.size()) PostReceive(message + kWindow);
  }

  Staging& staging_;
  const ExchangePlan& plan_;
  const Ends ends_;
  const uint64_t collective_;
  const uint64_t slot_;
  const Clock::time_point deadline_;
  std::vector<const OutgoingChunk*> sends_;  // the plan's, in order
  std::vector<size_t> recv_bytes_;           // of the plan's receives, in order
  size_t sent_ = 0, completed_sends_ = 0, received_ = 0;
};

SealedChannel::SealedChannel(std::shared_ptr<gloo::Context> context, const TrafficKey& group_key,
                             std::string group, int channel)
    : context_(std::move(context)),
      group_key_(group_key),
      group_(std::move(group)),
      channel_(channel),
      rank_(context_->rank),
      size_(context_->size),
      outgoing_(size_),
      incoming_(size_) {}

SealedChannel::~SealedChannel() = default;

DirectionCipher& SealedChannel::CipherFor(int sender, int receiver) {
  const bool sending = sender == rank_;
  std::unique_ptr<DirectionCipher>& cipher = sending ? outgoing_[receiver] : incoming_[sender];
  if (!cipher) {
    cipher = std::make_unique<DirectionCipher>(
        group_key_, TrafficDirection{group_, channel_, sender, receiver});
  }
  return *cipher;
}

void SealedChannel::Run(const ExchangePlan& plan, const detail::ReduceKernel* kernel,
                        uint64_t collective, std::chrono::milliseconds timeout) {
  if (plan.steps.empty()) return;
  if (plan.steps.size() > std::numeric_limits<uint32_t>::max()) {
    throw CommError("a sealed collective of " + std::to_string(plan.steps.size()) +
                    " messages in one direction: more than a 32-bit message index can number");
  }
  if (!staging_) staging_ = std::make_unique<Staging>(*context_);
  Pipeline::Ends ends;
  if (plan.send_to >= 0) ends.sealer = &CipherFor(rank_, plan.send_to);
  if (plan.recv_from >= 0) ends.opener = &CipherFor(plan.recv_from, rank_);
  ends.kernel = kernel;
  ends.group_size = size_;
  Pipeline(*staging_, plan, ends, collective, timeout).Run();
}

void SealedChannel::AllReduce(void* data, size_t count, const detail::ReduceKernel& kernel,
                              uint64_t collective, std::chrono::milliseconds timeout) {
  Run(RingAllReducePlan(static_cast<uint8_t*>(data), count, kernel.element_size, rank_, size_,
                        kChunkBytes),
      &kernel, collective, timeout);
}

void SealedChannel::Broadcast(void* data, size_t bytes, int root, uint64_t collective,
                              std::chrono::milliseconds timeout) {
  Run(ChainBroadcastPlan(static_cast<uint8_t*>(data), bytes, root, rank_, size_, kChunkBytes),
      nullptr, collective, timeout);
}

void SealedChannel::AllGather(const void* input, size_t bytes, const std::vector<void*>& outputs,
                              uint64_t collective, std::chrono::milliseconds timeout) {
  std::vector<uint8_t*> blocks;
  blocks.reserve(outputs.size());
  for (void* output : outputs) blocks.push_back(static_cast<uint8_t*>(output));
  Run(RingAllGatherPlan(static_cast<const uint8_t*>(input), blocks, bytes, rank_, size_,
                        kChunkBytes),
      nullptr, collective, timeout);
  if (outputs[rank_] != input && bytes > 0) std::memcpy(outputs[rank_], input, bytes);
}

}  // namespace gradhub::ddp
