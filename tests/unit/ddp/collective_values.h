// Tensors with known values for collective tests, and checks of what came back. Host (CPU)
// tensors only: a backend's tests copy them to its device and back.
#pragma once

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "gpu_worker/ddp/comm/collective_checks.h"

namespace gradhub::ddp::testing {

inline double ToDouble(float v) { return v; }
inline double ToDouble(double v) { return v; }
inline double ToDouble(int64_t v) { return static_cast<double>(v); }
inline double ToDouble(at::Half v) { return static_cast<float>(v); }
inline double ToDouble(at::BFloat16 v) { return static_cast<float>(v); }

// A 1-D host tensor of `type` whose element i is value(i).
template <typename Fn>
at::Tensor MakeTensor(at::ScalarType type, int64_t numel, Fn value) {
  at::Tensor tensor = at::empty({numel}, at::TensorOptions().dtype(type));
  detail::VisitSupportedDtype(type, [&](auto tag) {
    using T = decltype(tag);
    T* data = tensor.data_ptr<T>();
    for (int64_t i = 0; i < numel; ++i) data[i] = static_cast<T>(static_cast<float>(value(i)));
  });
  return tensor;
}

// Every element of the host tensor equals expected(i); on failure names the first wrong one
// and how many are.
template <typename Fn>
::testing::AssertionResult HasValues(const at::Tensor& tensor, Fn expected) {
  int64_t wrong = 0, first = -1;
  double first_got = 0, first_want = 0;
  detail::VisitSupportedDtype(tensor.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    const T* data = tensor.data_ptr<T>();
    for (int64_t i = 0; i < tensor.numel(); ++i) {
      const double got = ToDouble(data[i]);
      const double want = expected(i);
      if (got != want && wrong++ == 0) {
        first = i;
        first_got = got;
        first_want = want;
      }
    }
  });
  if (wrong == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << wrong << " of " << tensor.numel() << " elements wrong, first at " << first << ": got "
         << first_got << ", want " << first_want;
}

// Rank r's element i in a world of n: n * ((i + r) % 5 + 1). Sums, averages (sum / n) and
// maxima are then small integers, exact in every dtype, bfloat16 included.
inline double Value(int64_t i, int rank, int n) {
  return n * static_cast<double>((i + rank) % 5 + 1);
}
inline double Sum(int64_t i, int n) {
  double sum = 0;
  for (int r = 0; r < n; ++r) sum += Value(i, r, n);
  return sum;
}
inline double Max(int64_t i, int n) {
  double best = Value(i, 0, n);
  for (int r = 1; r < n; ++r) best = std::max(best, Value(i, r, n));
  return best;
}
inline double Min(int64_t i, int n) {
  double best = Value(i, 0, n);
  for (int r = 1; r < n; ++r) best = std::min(best, Value(i, r, n));
  return best;
}

inline bool BitwiseEqual(const at::Tensor& a, const at::Tensor& b) {
  return a.scalar_type() == b.scalar_type() && a.nbytes() == b.nbytes() &&
         std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0;
}

}  // namespace gradhub::ddp::testing
