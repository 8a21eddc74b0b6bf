#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gpu_worker/ddp/comm/gloo/exchange_plans.h"
#include "gpu_worker/ddp/comm/gloo/traffic_sealing.h"
#include "gpu_worker/ddp/comm/reduce_kernels.h"
#include "gpu_worker/ddp/store.h"

namespace gloo {
class Context;
}

namespace gradhub::ddp {

// The collectives of one channel of a GlooProcessGroup with GlooOptions::encrypt_traffic:
// Debian's Gloo has no TLS transport, so every message is sealed with AES-256-GCM
// (traffic_sealing.h) before gloo sends it, and opened and authenticated before a byte of it
// is used. Allreduce, allgather and broadcast run the plans of exchange_plans.h (ring, ring,
// chain) over gloo's unbound buffers on the channel's context; a barrier carries no data and
// stays gloo's.
//
// One collective (Run), W = kWindow, every message of it on one gloo slot made from its
// sequence number (gloo matches a slot's messages between two ranks in order):
//  1. The first W receives are posted at once, into W receive slots of kChunkBytes + tag, so
//     that a peer's sends never wait for this rank to ask.
//  2. For each step of the plan, in order:
//     a. send: the step's chunk, unless it went out ahead, then up to W - 1 later chunks whose
//        bytes are already final (exchange_plans.h, after_receives). Each waits until the send
//        W before it has completed (its slot is free again), is sealed into that slot (label:
//        the collective's number, the message's index in its direction) and posted. gloo
//        writes it (this thread when the socket takes it at once, else gloo's event loop)
//        while this thread seals the next chunks and the peer's messages travel, so sealing
//        overlaps sending and receiving.
//     b. receive: wait for the next message and open it, its tag checked over the whole
//        message: a chunk to reduce into scratch, and only then reduced into the tensor; a
//        chunk that overwrites its place (allreduce's all-gather half, broadcast, allgather)
//        straight into that place. Post the receive W messages later into the slot just
//        emptied.
//  3. Wait for the sends still in flight.
//
// Failure cases:
//  - A message that does not authenticate (a flipped bit, a replayed, reordered, truncated
//    or foreign message) throws TrafficAuthenticationError naming its sender; no element of it
//    was reduced (an overwritten place holds unspecified bytes, as after any failed
//    collective). The process group then breaks with CommError "collective traffic failed
//    authentication from rank R (tampered or corrupted)".
//  - A peer that does not send or receive within the collective's timeout, or a closed
//    connection: gloo's IoException, as for the plain collectives. A failed collective leaves
//    this channel out of step (messages may still arrive into its slots); the group is broken
//    and never uses it again.
//
// What stays plaintext: a barrier (no data), and an allreduce through the shared-memory
// segment of ranks all on one host (GlooOptions::shared_memory): no traffic leaves the host
// there, and the segment is a 0600 file of the job's uid, unlinked once mapped.
//
// Not thread-safe: the channel's thread runs one collective at a time. Every rank must run
// the same collectives with the same sizes in the same order (sizes decide the chunks).
class SealedChannel {
 public:
  // Largest chunk a message carries: gloo's own ring's largest segment, so a sealed
  // allreduce sends as many messages as a plain one; each costs gloo wakeups and a round trip
  // (256 KiB chunks: an 8 MiB allreduce of two ranks ~15% slower on a 2-core VM), and a chunk
  // opened into scratch is still in cache when it is reduced.
  static constexpr size_t kChunkBytes = size_t{1} << 20;
  // Messages in flight in each direction.
  static constexpr size_t kWindow = 4;

  // `context` is the channel's connected gloo context (rank and size are its own).
  SealedChannel(std::shared_ptr<gloo::Context> context, const TrafficKey& group_key,
                std::string group, int channel);
  ~SealedChannel();
  SealedChannel(const SealedChannel&) = delete;
  SealedChannel& operator=(const SealedChannel&) = delete;

  // In place over `count` elements at `data` with `kernel` (its divide included, for an
  // average): every rank ends with the same bits.
  void AllReduce(void* data, size_t count, const detail::ReduceKernel& kernel, uint64_t collective,
                 std::chrono::milliseconds timeout);
  // `bytes` at `data` from `root` to every rank.
  void Broadcast(void* data, size_t bytes, int root, uint64_t collective,
                 std::chrono::milliseconds timeout);
  // outputs[r] (one per rank, `bytes` each) receives rank r's `input`.
  void AllGather(const void* input, size_t bytes, const std::vector<void*>& outputs,
                 uint64_t collective, std::chrono::milliseconds timeout);

 private:
  struct Staging;
  class Pipeline;

  void Run(const ExchangePlan& plan, const detail::ReduceKernel* kernel, uint64_t collective,
           std::chrono::milliseconds timeout);
  // The cipher of messages from `sender` to `receiver` (one of them this rank), made on first
  // use: a ring only ever needs its two neighbours'.
  DirectionCipher& CipherFor(int sender, int receiver);

  const std::shared_ptr<gloo::Context> context_;
  const TrafficKey group_key_;
  const std::string group_;
  const int channel_;
  const int rank_, size_;
  // [peer]: sealing towards it, opening from it.
  std::vector<std::unique_ptr<DirectionCipher>> outgoing_, incoming_;
  std::unique_ptr<Staging> staging_;
};

// The one-time agreement, through the store, on whether a group encrypts its traffic, and its
// group key. Run by every rank once the channels are connected.
//
// Protocol (keys under `prefix`, e.g. "default/sealing/"):
//  1. Every rank but 0 sets "encrypt/<r>" to "1" or "0": its GlooOptions::encrypt_traffic.
//  2. Rank 0 reads them in rank order. If one differs from its own, it sets "verdict" to "!"
//     and the mismatch; else, encrypting, it draws the group key (DrawTrafficKey) and sets
//     "verdict" to "key:" and the key's 32 bytes; else to "plain".
//  3. Every rank but 0 reads "verdict".
// Each rank waits only for keys that are written on every path. The key is as secret as the
// store: the platform's rendezvous store is TLS and answers only the attempt's job token, so
// only that attempt's ranks can read it; every attempt (and every group) draws a new one.
struct TrafficKeyAgreement {
  struct Options {
    std::shared_ptr<Store> store;
    std::string prefix;
    int rank = 0;
    int size = 1;
    bool encrypt = false;
    std::chrono::milliseconds timeout{0};
  };

  // The group key when every rank encrypts, nullopt when none does. Throws
  // std::invalid_argument on every rank when they disagree ("ranks disagree on
  // GlooOptions::encrypt_traffic (...): rank 0 has true, rank 2 has false"), store errors as
  // they come.
  static std::optional<TrafficKey> Establish(const Options& options);
};

}  // namespace gradhub::ddp
