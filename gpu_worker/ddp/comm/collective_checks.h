// What every backend checks and says about a collective before it queues it, written once so
// the backends agree on what they accept and on the words of their errors and descriptions:
//   1. the operands (defined, dense, contiguous, a supported dtype, on the group's device;
//      the root in range; one allgather output per rank, shaped and typed like the input),
//      std::invalid_argument "<op> in group '<name>' rank <r>/<n>: <operand> <problem>";
//   2. the description of its Work ("allreduce #17 (float32, 4096 elements, sum) in group
//      'job-1' rank 1/2"), which every later error about it starts with.
// A refused call takes no sequence number, so the group stays in step. Pure functions.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "gpu_worker/ddp/comm/process_group.h"

namespace gradhub::ddp::detail {

// The names users know from PyTorch ("float32", not ATen's "Float").
std::string DtypeName(at::ScalarType type);

// What every backend reduces: float32, float64, float16, bfloat16, int64 (see ProcessGroup).
bool IsSupportedDtype(at::ScalarType type);

// Calls fn(T{}) with the C++ type of `type`, one of the supported five (float, double,
// at::Half, at::BFloat16, int64_t); std::invalid_argument for any other.
template <typename Fn>
void VisitSupportedDtype(at::ScalarType type, Fn&& fn) {
  switch (type) {
    case at::kFloat:
      return fn(float{});
    case at::kDouble:
      return fn(double{});
    case at::kHalf:
      return fn(at::Half{});
    case at::kBFloat16:
      return fn(at::BFloat16{});
    case at::kLong:
      return fn(int64_t{});
    default:
      throw std::invalid_argument("unsupported dtype " + DtypeName(type));
  }
}

// The checked operands of one collective.
struct CheckedCollective {
  // What the Work's description says about the operands, e.g. "float32, 4096 elements, sum".
  std::string detail;
  // No bytes to move: the backend completes it at once (it still takes a sequence number).
  bool empty = false;
};

// Each checks step 1 for `group`, whose tensors live on `device`, and throws
// std::invalid_argument on the first problem.
CheckedCollective CheckBroadcast(const ProcessGroup& group, const c10::Device& device,
                                 const std::vector<at::Tensor>& tensors, int root);
CheckedCollective CheckAllReduce(const ProcessGroup& group, const c10::Device& device,
                                 const at::Tensor& tensor, ReduceOp op);
CheckedCollective CheckAllGather(const ProcessGroup& group, const c10::Device& device,
                                 const std::vector<at::Tensor>& outputs, const at::Tensor& input);

// Send (`sending`) or Recv: `tensor` as for allreduce, `peer` (named "dst" or "src") in
// [0, size) and not this rank. Its detail: "float32, 4096 elements, to rank 1, tag 7".
CheckedCollective CheckPointToPoint(const ProcessGroup& group, const c10::Device& device,
                                    bool sending, const at::Tensor& tensor, int peer, uint32_t tag);

// Step 2: "<kind> #<seq> (<detail>) in group '<name>' rank <r>/<n>".
std::string DescribeCollective(const ProcessGroup& group, const char* kind, uint64_t seq,
                               const std::string& detail);

// Whether outputs[r] starts r * bytes after outputs[0] for every r: slices of one flat buffer
// that an allgather can write into directly, without a temporary.
bool IsOneFlatBuffer(const std::vector<at::Tensor>& outputs, size_t bytes);

}  // namespace gradhub::ddp::detail
