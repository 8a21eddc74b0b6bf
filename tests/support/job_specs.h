// The smallest valid JobSpec, for tests of the job API that need a job but not its contents,
// and requests the tests of the job API build again and again.
#pragma once

#include <cstdint>
#include <string>

#include "gradhub/v1/jobs.pb.h"

namespace gradhub::testing {

// The full job spec of docs/architecture.md ("A job spec"), every section set, as a user writes it.
inline constexpr char kArchitectureExampleYaml[] = R"(displayName: digits-mlp
labels: {team: vision}
model:
  mlp: {layers: [64, 256, 256, 10], activation: relu, dropout: 0.1}
dataset:
  csv: {path: /data/digits.csv.gz, labelColumnIndex: -1, normalize: standard}
  validationFraction: 0.2
optimizer:
  sgd: {lr: 0.01, momentum: 0.9, weightDecay: 0.0001}
lrSchedule:
  step: {stepSize: 200, gamma: 0.5}
  warmupSteps: 50
batchSizePerRank: 64
maxSteps: 1000
evalEverySteps: 100
distributed:
  worldSize: 2
  ranksPerNode: 1
  backend: AUTO
  bucketCapMb: 25
  commHook: NONE
checkpoint: {everySteps: 200, keepLast: 3}
maxRestarts: {infrastructure: 5, job: 1}
hangTimeoutSeconds: 60
priority: 0
seed: 42
)";

inline v1::JobSpec MinimalJobSpec() {
  v1::JobSpec spec;
  spec.mutable_model()->mutable_mlp()->add_layers(64);
  spec.mutable_model()->mutable_mlp()->add_layers(10);
  spec.mutable_dataset()->mutable_csv()->set_path("/data/digits.csv.gz");
  spec.mutable_optimizer()->mutable_sgd()->set_lr(0.05);
  spec.set_batch_size_per_rank(32);
  spec.set_max_steps(10);
  return spec;
}

// A job that really trains, on a synthetic dataset (nothing to read from disk): world 4, two
// ranks on each of two nodes of two slots (LocalCluster's default agents). Unloaded it runs
// 400-900 steps a second: size `max_steps` for how long it must outlive a fault. It may restart
// twice for the infrastructure, never for itself.
inline v1::JobSpec SyntheticTrainingSpec(int64_t max_steps) {
  v1::JobSpec spec;
  for (int32_t width : {32, 64, 4}) spec.mutable_model()->mutable_mlp()->add_layers(width);
  v1::SyntheticDataset* synthetic = spec.mutable_dataset()->mutable_synthetic();
  synthetic->set_num_samples(4096);
  synthetic->set_num_features(32);
  synthetic->set_num_classes(4);
  synthetic->set_noise(0.5);
  spec.mutable_dataset()->set_validation_fraction(0.1);
  spec.mutable_optimizer()->mutable_sgd()->set_lr(0.05);
  spec.mutable_optimizer()->mutable_sgd()->set_momentum(0.9);
  spec.set_batch_size_per_rank(16);
  spec.set_max_steps(max_steps);
  spec.set_log_every_steps(100);
  spec.mutable_distributed()->set_world_size(4);
  spec.mutable_distributed()->set_ranks_per_node(2);
  spec.mutable_max_restarts()->set_infrastructure(2);
  spec.mutable_max_restarts()->set_job(0);
  spec.set_hang_timeout_seconds(60);
  return spec;
}

// One page of up to 1000 events of `job`, the most a page holds.
inline v1::ListJobEventsRequest EventsOf(const std::string& job, const std::string& filter = "") {
  v1::ListJobEventsRequest request;
  request.set_parent(job);
  request.set_page_size(1000);
  request.set_filter(filter);
  return request;
}

}  // namespace gradhub::testing
