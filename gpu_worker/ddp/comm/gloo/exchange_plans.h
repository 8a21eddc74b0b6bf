// What each rank sends and receives, in which order, in the encrypted collectives
// (sealed_channel.h): pure functions of the buffers, the rank and the world, no transport, so
// the algorithms are tested by running every rank's plan over in-memory queues
// (tests/unit/ddp/exchange_plans_test.cc).
//
// A plan is a list of steps along a ring or a chain: each step sends at most one chunk to the
// next rank (send_to), then receives at most one chunk from the previous one (recv_from).
// Chunks are at most `chunk_bytes` (whole elements for allreduce); both ends of a link compute
// the same sizes. A chunk sent at step i was complete when step i began: it is either the
// rank's own data or one received (and reduced) at an earlier step (its after_receives says
// which), so a rank that runs its steps in order, sending before receiving, never waits for
// itself, and a ring of such ranks never deadlocks (each step needs only the previous rank's
// send of the same step). A rank may also send a chunk ahead of its step once after_receives
// of its receives are done.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

namespace gradhub::ddp {

struct OutgoingChunk {
  const uint8_t* plain = nullptr;
  size_t bytes = 0;
  // How many of the plan's receives (in order) must be done before the chunk holds what it
  // sends: 0 for the rank's own data, else one more than the index of the receive that
  // completes it. It may go out as early as that, ahead of its step.
  size_t after_receives = 0;
};

struct IncomingChunk {
  uint8_t* target = nullptr;
  size_t bytes = 0;
  // Reduce into `target` (target = target op received); else overwrite it.
  bool reduce = false;
  // The chunk's last reduction: with an average over other than two ranks, divide now.
  bool complete = false;
};

struct ExchangeStep {
  std::optional<OutgoingChunk> send;
  std::optional<IncomingChunk> recv;
};

struct ExchangePlan {
  int send_to = -1;    // -1: this rank sends nothing
  int recv_from = -1;  // -1: this rank receives nothing
  std::vector<ExchangeStep> steps;
};

// Ring allreduce of `count` elements of `element_size` bytes at `data`, in place (Patarasuk
// and Yuan's bandwidth-optimal ring, as gloo's and NCCL's):
//  1. The tensor is cut into `size` blocks, block b the elements [count*b/size,
//     count*(b+1)/size), each into C chunks (C from the largest block; a smaller block's last
//     chunks may be empty and still travel, as a bare tag).
//  2. Reduce-scatter, steps s = 0 .. size-2: rank r sends block (r - s) mod size to r + 1 and
//     reduces block (r - s - 1) mod size received from r - 1 into its own. After it, rank r
//     holds block (r + 1) mod size reduced over every rank (marked `complete` at its last
//     step), computed once, so every rank ends with the same bits.
//  3. All-gather, steps t = 0 .. size-2: rank r sends block (r + 1 - t) mod size and
//     overwrites block (r - t) mod size with what it receives.
// Each rank sends and receives 2 (size-1)/size of the tensor. Empty for size 1.
ExchangePlan RingAllReducePlan(uint8_t* data, size_t count, size_t element_size, int rank, int size,
                               size_t chunk_bytes);

// Ring allgather of `bytes` per rank: outputs[r] receives rank r's input. Rank r's own block
// is sent from `input` (the caller copies it into outputs[rank]); at step t = 0 .. size-2 rank
// r sends block (r - t) mod size to r + 1 and receives block (r - t - 1) mod size from r - 1.
ExchangePlan RingAllGatherPlan(const uint8_t* input, const std::vector<uint8_t*>& outputs,
                               size_t bytes, int rank, int size, size_t chunk_bytes);

// Pipelined chain broadcast of `bytes` at `data` from `root`: root -> root + 1 -> ... ->
// root - 1 (mod size), chunk by chunk; each rank but the last forwards chunk k while chunk
// k + 1 arrives. Every link carries the data once (gloo's one-to-all sends it size-1 times
// from the root).
ExchangePlan ChainBroadcastPlan(uint8_t* data, size_t bytes, int root, int rank, int size,
                                size_t chunk_bytes);

}  // namespace gradhub::ddp
