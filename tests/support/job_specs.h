// The smallest valid JobSpec, for tests of the job API that need a job but not its contents.
#pragma once

#include "gradhub/v1/jobs.pb.h"

namespace gradhub::testing {

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

}  // namespace gradhub::testing
