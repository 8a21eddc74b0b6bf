// The element-wise reductions every CPU allreduce path runs: the gloo ring (handed to gloo as
// its reduce function) and the same-host shared-memory path. One set of loops, so both paths
// round alike and a result does not depend on which path a group took.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstddef>

#include "gpu_worker/ddp/comm/process_group.h"

namespace gradhub::ddp::detail {

// out[i] = a[i] (op) b[i] for i < n. `out` may be `a` or `b` (exactly, not partly overlapping).
using ReduceFn = void (*)(void* out, const void* a, const void* b, size_t n);
// data[i] = data[i] / divisor, rounded as kAverage's second step.
using DivideFn = void (*)(void* data, size_t n, int divisor);

// What one allreduce of a (dtype, op, group size) runs. float16 and bfloat16 go through float
// (one rounding per pairwise step; gloo has no bfloat16 type, and doing both the same way
// keeps their rounding alike).
struct ReduceKernel {
  ReduceFn reduce = nullptr;
  // kAverage over other than two ranks: sum, then this over the sum. Null when the average
  // is done inside `reduce` (two ranks: each output element comes from exactly one reduce
  // call on the two ranks' values, so halving there is the whole average; integers truncate,
  // as sum-then-divide does) and for the other ops.
  DivideFn divide = nullptr;
  size_t element_size = 0;
};

// Throws std::invalid_argument for a dtype outside the supported five (see ProcessGroup).
ReduceKernel KernelFor(c10::ScalarType type, ReduceOp op, int group_size);

}  // namespace gradhub::ddp::detail
