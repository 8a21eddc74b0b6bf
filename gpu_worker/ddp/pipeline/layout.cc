#include "gpu_worker/ddp/pipeline/layout.h"

#include <stdexcept>
#include <string>

namespace gradhub::ddp::pipeline {

PipelineLayout::PipelineLayout(int world_size, int stages) : stages_(stages), replicas_(0) {
  if (world_size < 1) {
    throw std::invalid_argument("pipeline layout: world size is " + std::to_string(world_size) +
                                "; it must be >= 1");
  }
  if (stages < 1 || world_size % stages != 0) {
    throw std::invalid_argument("parallelism.pipelineStages is " + std::to_string(stages) +
                                "; it must be >= 1 and divide the world size " +
                                std::to_string(world_size));
  }
  replicas_ = world_size / stages;
}

int PipelineLayout::PreviousRank(int rank) const {
  return RankOf(ReplicaOf(rank), (StageOf(rank) + stages_ - 1) % stages_);
}

int PipelineLayout::NextRank(int rank) const {
  return RankOf(ReplicaOf(rank), (StageOf(rank) + 1) % stages_);
}

std::vector<int> PipelineLayout::DataParallelRanks(int stage) const {
  std::vector<int> ranks;
  for (int replica = 0; replica < replicas_; ++replica) ranks.push_back(RankOf(replica, stage));
  return ranks;
}

}  // namespace gradhub::ddp::pipeline
