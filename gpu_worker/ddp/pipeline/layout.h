// Where each rank of a pipeline-parallel job sits: world = S stages x D replicas.
//
//   rank = replica * S + stage
//
// A replica's pipeline is S consecutive ranks, so the scheduler's in-order placement keeps a
// stage's neighbours on its node where the node has room. Stage s of replica d receives
// activations from rank - 1 and sends them to rank + 1; with the interleaved schedule the last
// stage's chunk c also sends to stage 0's chunk c + 1, so the neighbours are taken around the
// replica's ring: (s - 1) mod S and (s + 1) mod S. The ranks holding stage s, {d * S + s for
// d in 0..D-1}, are its data-parallel group (CreateSubgroup), whose gradients the existing
// DistributedDataParallel averages.
//
// Thread-compatible: a value type.
#pragma once

#include <vector>

namespace gradhub::ddp::pipeline {

class PipelineLayout {
 public:
  // Throws std::invalid_argument naming parallelism.pipelineStages when `stages` < 1 or does
  // not divide `world_size` (>= 1).
  PipelineLayout(int world_size, int stages);

  int stages() const { return stages_; }
  int replicas() const { return replicas_; }
  int world_size() const { return stages_ * replicas_; }

  int StageOf(int rank) const { return rank % stages_; }
  int ReplicaOf(int rank) const { return rank / stages_; }
  int RankOf(int replica, int stage) const { return replica * stages_ + stage; }
  // The neighbours in the replica's ring (a one-stage pipeline is its own neighbour).
  int PreviousRank(int rank) const;
  int NextRank(int rank) const;
  // Stage 0 of the rank's replica: where the step's loss goes (global rank 0 logs it).
  int FirstStageRank(int rank) const { return RankOf(ReplicaOf(rank), 0); }
  int LastStageRank(int rank) const { return RankOf(ReplicaOf(rank), stages_ - 1); }
  // The ranks holding `stage`, ascending: the stage's data-parallel group.
  std::vector<int> DataParallelRanks(int stage) const;

 private:
  int stages_, replicas_;
};

}  // namespace gradhub::ddp::pipeline
