#include "gpu_worker/data/sampler.h"

#include <stdexcept>

namespace gradhub::data {

void SeededShuffle(std::vector<int64_t>& values, uint64_t seed) {
  std::mt19937_64 generator(seed);  // its output sequence is fixed by the standard
  for (size_t i = values.size(); i > 1; --i) {
    // Rejection sampling keeps the draw uniform without relying on a distribution object,
    // whose algorithm (unlike the engine's) the standard leaves open.
    const uint64_t bound = i;
    const uint64_t limit = UINT64_MAX - UINT64_MAX % bound;
    uint64_t draw;
    do {
      draw = generator();
    } while (draw >= limit);
    std::swap(values[i - 1], values[draw % bound]);
  }
}

DistributedSampler::DistributedSampler(std::vector<int64_t> indices, int world_size, int rank,
                                       uint64_t seed, bool shuffle, bool drop_last)
    : indices_(std::move(indices)),
      world_size_(world_size),
      rank_(rank),
      seed_(seed),
      shuffle_(shuffle) {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    throw std::invalid_argument("DistributedSampler: rank " + std::to_string(rank) +
                                " outside world size " + std::to_string(world_size));
  }
  const int64_t n = static_cast<int64_t>(indices_.size());
  per_rank_ = drop_last ? n / world_size : (n + world_size - 1) / world_size;
}

std::vector<int64_t> DistributedSampler::EpochIndices(int64_t epoch) const {
  std::vector<int64_t> order = indices_;
  if (shuffle_) SeededShuffle(order, seed_ + static_cast<uint64_t>(epoch));
  std::vector<int64_t> mine;
  mine.reserve(per_rank_);
  if (order.empty()) return mine;
  for (int64_t i = 0; i < per_rank_; ++i) {
    // Past the end wraps around: the padding repeats the first samples, as PyTorch's does.
    const int64_t position = i * world_size_ + rank_;
    mine.push_back(order[position % static_cast<int64_t>(order.size())]);
  }
  return mine;
}

}  // namespace gradhub::data
