#include "gpu_worker/ddp/comm/gloo/exchange_plans.h"

#include <algorithm>

namespace gradhub::ddp {
namespace {

size_t Mod(int64_t value, int size) { return static_cast<size_t>(((value % size) + size) % size); }

size_t CeilDiv(size_t a, size_t b) { return (a + b - 1) / b; }

// A run of bytes cut into chunks of `chunk` bytes; chunk k of a shorter run may be empty.
struct Chunks {
  uint8_t* base = nullptr;
  size_t bytes = 0;
  size_t chunk = 1;

  uint8_t* At(size_t k) const { return base + std::min(bytes, k * chunk); }
  size_t Size(size_t k) const {
    const size_t start = std::min(bytes, k * chunk);
    return std::min(bytes, start + chunk) - start;
  }
  OutgoingChunk Out(size_t k, size_t after_receives) const {
    return {At(k), Size(k), after_receives};
  }
  IncomingChunk In(size_t k, bool reduce, bool complete) const {
    return {At(k), Size(k), reduce, complete};
  }
};

// On a ring every step receives, and the chunk sent at step i is the one received at step
// i - chunks (the same chunk of the block one step of the ring earlier), or the rank's own.
size_t AfterRingStep(size_t step, size_t chunks) { return step >= chunks ? step - chunks + 1 : 0; }

// The two neighbours of `rank` on the ring 0 -> 1 -> ... -> size-1 -> 0.
void OnRing(ExchangePlan& plan, int rank, int size) {
  plan.send_to = static_cast<int>(Mod(rank + 1, size));
  plan.recv_from = static_cast<int>(Mod(rank - 1, size));
}

}  // namespace

ExchangePlan RingAllReducePlan(uint8_t* data, size_t count, size_t element_size, int rank, int size,
                               size_t chunk_bytes) {
  ExchangePlan plan;
  if (size < 2) return plan;
  OnRing(plan, rank, size);
  const size_t chunk = std::max<size_t>(1, chunk_bytes / element_size) * element_size;
  std::vector<Chunks> blocks(size);
  size_t largest = 0;
  for (int b = 0; b < size; ++b) {
    const size_t start = count * b / size, end = count * (b + 1) / size;
    blocks[b] = Chunks{data + start * element_size, (end - start) * element_size, chunk};
    largest = std::max(largest, blocks[b].bytes);
  }
  const size_t chunks = std::max<size_t>(1, CeilDiv(largest, chunk));
  for (int s = 0; s < size - 1; ++s) {
    const Chunks& out = blocks[Mod(rank - s, size)];
    const Chunks& in = blocks[Mod(rank - s - 1, size)];
    for (size_t k = 0; k < chunks; ++k) {
      plan.steps.push_back({out.Out(k, AfterRingStep(plan.steps.size(), chunks)),
                            in.In(k, /*reduce=*/true, /*complete=*/s == size - 2)});
    }
  }
  for (int t = 0; t < size - 1; ++t) {
    const Chunks& out = blocks[Mod(rank + 1 - t, size)];
    const Chunks& in = blocks[Mod(rank - t, size)];
    for (size_t k = 0; k < chunks; ++k) {
      plan.steps.push_back({out.Out(k, AfterRingStep(plan.steps.size(), chunks)),
                            in.In(k, /*reduce=*/false, /*complete=*/false)});
    }
  }
  return plan;
}

ExchangePlan RingAllGatherPlan(const uint8_t* input, const std::vector<uint8_t*>& outputs,
                               size_t bytes, int rank, int size, size_t chunk_bytes) {
  ExchangePlan plan;
  if (size < 2) return plan;
  OnRing(plan, rank, size);
  const size_t chunk = std::max<size_t>(1, chunk_bytes);
  const size_t chunks = std::max<size_t>(1, CeilDiv(bytes, chunk));
  for (int t = 0; t < size - 1; ++t) {
    const size_t out_block = Mod(rank - t, size);
    // The rank's own block goes out from `input`: the caller's copy into outputs[rank] may
    // not have happened yet, and need not have.
    uint8_t* source = t == 0 ? const_cast<uint8_t*>(input) : outputs[out_block];
    const Chunks out{source, bytes, chunk};
    const Chunks in{outputs[Mod(rank - t - 1, size)], bytes, chunk};
    for (size_t k = 0; k < chunks; ++k) {
      plan.steps.push_back({out.Out(k, AfterRingStep(plan.steps.size(), chunks)),
                            in.In(k, /*reduce=*/false, /*complete=*/false)});
    }
  }
  return plan;
}

ExchangePlan ChainBroadcastPlan(uint8_t* data, size_t bytes, int root, int rank, int size,
                                size_t chunk_bytes) {
  ExchangePlan plan;
  if (size < 2) return plan;
  const size_t position = Mod(rank - root, size);  // 0: the root, size-1: the chain's end
  const bool sends = position + 1 < static_cast<size_t>(size);
  const bool receives = position > 0;
  if (sends) plan.send_to = static_cast<int>(Mod(rank + 1, size));
  if (receives) plan.recv_from = static_cast<int>(Mod(rank - 1, size));
  const Chunks all{data, bytes, std::max<size_t>(1, chunk_bytes)};
  const size_t chunks = std::max<size_t>(1, CeilDiv(bytes, all.chunk));
  // Step k forwards chunk k - 1 (received at step k - 1) and receives chunk k; the root sends
  // chunk k at step k, and the chain's end only receives.
  const size_t steps = chunks + (sends && receives ? 1 : 0);
  for (size_t k = 0; k < steps; ++k) {
    ExchangeStep step;
    if (sends && !receives) step.send = all.Out(k, 0);
    if (sends && receives && k > 0) step.send = all.Out(k - 1, /*after_receives=*/k);
    if (receives && k < chunks) step.recv = all.In(k, /*reduce=*/false, /*complete=*/false);
    plan.steps.push_back(step);
  }
  return plan;
}

}  // namespace gradhub::ddp
