// Datasets' shapes for the model tests.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "gpu_worker/common/data_shape.h"

namespace gradhub::models {

inline DataShape Classification(std::vector<int64_t> sample, int64_t classes) {
  DataShape shape;
  shape.task = Task::kClassification;
  shape.sample_shape = std::move(sample);
  shape.num_classes = classes;
  return shape;
}

}  // namespace gradhub::models
