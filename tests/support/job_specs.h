// The smallest valid JobSpec, for tests of the job API that need a job but not its contents,
// and requests the tests of the job API build again and again.
#pragma once

#include <string>

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

// One page of up to 1000 events of `job`, the most a page holds.
inline v1::ListJobEventsRequest EventsOf(const std::string& job, const std::string& filter = "") {
  v1::ListJobEventsRequest request;
  request.set_parent(job);
  request.set_page_size(1000);
  request.set_filter(filter);
  return request;
}

}  // namespace gradhub::testing
