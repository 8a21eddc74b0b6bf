#include "gpu_worker/ddp/comm/reduce_kernels.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace gradhub::ddp::detail {
namespace {

template <typename T>
struct Plus {
  static T Apply(T a, T b) { return a + b; }
};
template <typename T>
struct Max {
  static T Apply(T a, T b) { return std::max(a, b); }
};
template <typename T>
struct Min {
  static T Apply(T a, T b) { return std::min(a, b); }
};
template <typename T>
struct MeanOfTwo {
  static T Apply(T a, T b) { return (a + b) / T(2); }
};

template <typename T>
constexpr bool kViaFloat = std::is_same_v<T, c10::Half> || std::is_same_v<T, c10::BFloat16>;

template <typename T, template <typename> class Op>
void ReduceNative(void* out, const void* a, const void* b, size_t n) {
  T* o = static_cast<T*>(out);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) o[i] = Op<T>::Apply(x[i], y[i]);
}

template <typename T, template <typename> class Op>
void ReduceViaFloat(void* out, const void* a, const void* b, size_t n) {
  T* o = static_cast<T*>(out);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) {
    o[i] = T(Op<float>::Apply(static_cast<float>(x[i]), static_cast<float>(y[i])));
  }
}

template <typename T, template <typename> class Op>
constexpr ReduceFn PickReduce() {
  if constexpr (kViaFloat<T>) {
    return &ReduceViaFloat<T, Op>;
  } else {
    return &ReduceNative<T, Op>;
  }
}

// Integers: exact (truncating) integer division.
template <typename T>
void DivideInPlace(void* data, size_t n, int divisor) {
  T* p = static_cast<T*>(data);
  if constexpr (kViaFloat<T>) {
    for (size_t i = 0; i < n; ++i) p[i] = T(static_cast<float>(p[i]) / divisor);
  } else {
    for (size_t i = 0; i < n; ++i) p[i] = p[i] / static_cast<T>(divisor);
  }
}

template <typename T>
ReduceKernel KernelOf(ReduceOp op, int group_size) {
  ReduceKernel kernel;
  kernel.element_size = sizeof(T);
  switch (op) {
    case ReduceOp::kSum:
      kernel.reduce = PickReduce<T, Plus>();
      break;
    case ReduceOp::kAverage:
      if (group_size == 2) {
        kernel.reduce = PickReduce<T, MeanOfTwo>();
      } else {
        kernel.reduce = PickReduce<T, Plus>();
        if (group_size > 1) kernel.divide = &DivideInPlace<T>;
      }
      break;
    case ReduceOp::kMax:
      kernel.reduce = PickReduce<T, Max>();
      break;
    case ReduceOp::kMin:
      kernel.reduce = PickReduce<T, Min>();
      break;
    default:
      throw std::invalid_argument("unknown ReduceOp");
  }
  return kernel;
}

}  // namespace

ReduceKernel KernelFor(c10::ScalarType type, ReduceOp op, int group_size) {
  switch (type) {
    case c10::kFloat:
      return KernelOf<float>(op, group_size);
    case c10::kDouble:
      return KernelOf<double>(op, group_size);
    case c10::kHalf:
      return KernelOf<c10::Half>(op, group_size);
    case c10::kBFloat16:
      return KernelOf<c10::BFloat16>(op, group_size);
    case c10::kLong:
      return KernelOf<int64_t>(op, group_size);
    default:
      throw std::invalid_argument(std::string("unsupported dtype ") + c10::toString(type));
  }
}

}  // namespace gradhub::ddp::detail
