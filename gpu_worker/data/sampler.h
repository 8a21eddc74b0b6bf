#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace gradhub::data {

// PyTorch's DistributedSampler: each epoch the indices are permuted from (seed, epoch), padded
// by wrapping around (or cut, with drop_last) to a multiple of the world size, and rank r
// takes every world_size-th one starting at r. Shards are disjoint and equally long, so every
// rank runs the same number of steps and no collective waits for a rank that ran out.
class DistributedSampler {
 public:
  DistributedSampler(std::vector<int64_t> indices, int world_size, int rank, uint64_t seed,
                     bool shuffle, bool drop_last);

  std::vector<int64_t> EpochIndices(int64_t epoch) const;
  int64_t per_rank() const { return per_rank_; }

 private:
  std::vector<int64_t> indices_;
  int world_size_;
  int rank_;
  uint64_t seed_;
  bool shuffle_;
  int64_t per_rank_;
};

// Fisher-Yates with explicit arithmetic: std::shuffle's algorithm is left to the standard
// library, and a different one on another node would give that node's ranks other shards.
void SeededShuffle(std::vector<int64_t>& values, uint64_t seed);

}  // namespace gradhub::data
