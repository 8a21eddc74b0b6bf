// Check macros for the communication backends, in the style of gloo's GLOO_ENFORCE and
// NCCL's NCCLCHECK (src/include/checks.h): every failing call is reported with the call's
// own text and [file:line], so a CommError read in a job's log says which call failed where.
//
//   GRADHUB_COMM_ENFORCE(cond, parts...)   throws CommError("<parts> (check `cond` failed) [f:l]")
//   GRADHUB_ARG_CHECK(cond, parts...)      throws std::invalid_argument("<parts> [f:l]"): for
//                                          caller mistakes (bad dtype, shape, device)
//   GRADHUB_GLOO_CHECK(call)               runs `call`; a gloo::Exception becomes CommError
//                                          "`call` failed: <what> [f:l]"
//   GRADHUB_CUDA_CHECK(call), GRADHUB_NCCL_CHECK(call)  (only where NCCL is built)
//                                          a non-success result becomes CommError naming the
//                                          call, the error string and [f:l]
//
// And the argument checks every backend makes before it queues a collective
// (detail::CheckTensorArg): one wording for "wrong dtype/device/layout" across backends.
#pragma once

#include <ATen/core/Tensor.h>

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

#include "gpu_worker/ddp/comm/work.h"
#include "gradhub/build_config.h"

#if GRADHUB_HAVE_NCCL
#include <cuda_runtime.h>
#include <nccl.h>
#endif

namespace gradhub::ddp::detail {

template <typename... Parts>
std::string StrCat(Parts&&... parts) {
  std::ostringstream out;
  (out << ... << std::forward<Parts>(parts));
  return out.str();
}

inline std::string Where(const char* file, int line) { return StrCat("[", file, ":", line, "]"); }

// The names users know from PyTorch ("float32", not ATen's "Float").
inline std::string DtypeName(at::ScalarType type) {
  switch (type) {
    case at::kFloat:
      return "float32";
    case at::kDouble:
      return "float64";
    case at::kHalf:
      return "float16";
    case at::kBFloat16:
      return "bfloat16";
    case at::kLong:
      return "int64";
    case at::kInt:
      return "int32";
    case at::kShort:
      return "int16";
    case at::kChar:
      return "int8";
    case at::kByte:
      return "uint8";
    case at::kBool:
      return "bool";
    default:
      return c10::toString(type);
  }
}

// What both backends reduce: see ProcessGroup.
inline bool IsSupportedDtype(at::ScalarType type) {
  return type == at::kFloat || type == at::kDouble || type == at::kHalf || type == at::kBFloat16 ||
         type == at::kLong;
}

// Throws std::invalid_argument "<where>: <arg> <problem>" unless `tensor` is defined, dense,
// contiguous, of a supported dtype and on `device`. `where` names the op, group and rank.
inline void CheckTensorArg(const std::string& where, const std::string& arg,
                           const at::Tensor& tensor, const c10::Device& device) {
  if (!tensor.defined()) throw std::invalid_argument(where + ": " + arg + " is undefined");
  if (tensor.layout() != at::kStrided) {
    throw std::invalid_argument(StrCat(
        where, ": ", arg, " must be a dense (strided) tensor, got layout ", tensor.layout()));
  }
  if (!IsSupportedDtype(tensor.scalar_type())) {
    throw std::invalid_argument(StrCat(where, ": ", arg, " has unsupported dtype ",
                                       DtypeName(tensor.scalar_type()),
                                       " (supported: float32, float64, float16, bfloat16, int64)"));
  }
  if (tensor.device() != device) {
    throw std::invalid_argument(StrCat(where, ": ", arg, " is on ", tensor.device(),
                                       ", this process group needs tensors on ", device));
  }
  if (!tensor.is_contiguous()) {
    throw std::invalid_argument(StrCat(where, ": ", arg, " is not contiguous (sizes ",
                                       tensor.sizes(), ", strides ", tensor.strides(),
                                       "); pass tensor.contiguous()"));
  }
}

}  // namespace gradhub::ddp::detail

#define GRADHUB_COMM_ENFORCE(cond, ...)                                                       \
  do {                                                                                        \
    if (!(cond)) {                                                                            \
      throw ::gradhub::ddp::CommError(                                                        \
          ::gradhub::ddp::detail::StrCat(__VA_ARGS__, " (check `" #cond "` failed) ",         \
                                         ::gradhub::ddp::detail::Where(__FILE__, __LINE__))); \
    }                                                                                         \
  } while (0)

#define GRADHUB_ARG_CHECK(cond, ...)                                             \
  do {                                                                           \
    if (!(cond)) {                                                               \
      throw std::invalid_argument(::gradhub::ddp::detail::StrCat(                \
          __VA_ARGS__, " ", ::gradhub::ddp::detail::Where(__FILE__, __LINE__))); \
    }                                                                            \
  } while (0)

// Needs gloo/common/error.h (for gloo::Exception) in the including file.
#define GRADHUB_GLOO_CHECK(call)                                                              \
  do {                                                                                        \
    try {                                                                                     \
      call;                                                                                   \
    } catch (const ::gloo::Exception& gloo_error) {                                           \
      throw ::gradhub::ddp::CommError(                                                        \
          ::gradhub::ddp::detail::StrCat("`" #call "` failed: ", gloo_error.what(), " ",      \
                                         ::gradhub::ddp::detail::Where(__FILE__, __LINE__))); \
    }                                                                                         \
  } while (0)

#if GRADHUB_HAVE_NCCL

#define GRADHUB_CUDA_CHECK(call)                                                                \
  do {                                                                                          \
    cudaError_t cuda_result = (call);                                                           \
    if (cuda_result != cudaSuccess) {                                                           \
      throw ::gradhub::ddp::CommError(                                                          \
          ::gradhub::ddp::detail::StrCat("`" #call "` failed: ", cudaGetErrorName(cuda_result), \
                                         ": ", cudaGetErrorString(cuda_result), " ",            \
                                         ::gradhub::ddp::detail::Where(__FILE__, __LINE__)));   \
    }                                                                                           \
  } while (0)

namespace gradhub::ddp::detail {
// ncclGetErrorString, plus the library's last detailed message where it has one (NCCL >= 2.13
// keeps one per thread; with a null comm it is the message of the last failing call).
inline std::string DescribeNcclResult(ncclResult_t result) {
  std::string text = ncclGetErrorString(result);
#if defined(NCCL_VERSION_CODE) && NCCL_VERSION_CODE >= NCCL_VERSION(2, 13, 0)
  const char* last = ncclGetLastError(nullptr);
  if (last != nullptr && *last != '\0') text += std::string(" (") + last + ")";
#endif
  return text;
}
}  // namespace gradhub::ddp::detail

// ncclInProgress (NCCL >= 2.14) is not an error: a nonblocking communicator returns it while
// the call is still being carried out; the caller polls ncclCommGetAsyncError.
#if defined(NCCL_VERSION_CODE) && NCCL_VERSION_CODE >= NCCL_VERSION(2, 14, 0)
#define GRADHUB_NCCL_IN_PROGRESS(result) ((result) == ncclInProgress)
#else
#define GRADHUB_NCCL_IN_PROGRESS(result) false
#endif

#define GRADHUB_NCCL_CHECK(call)                                                                \
  do {                                                                                          \
    ncclResult_t nccl_result = (call);                                                          \
    if (nccl_result != ncclSuccess && !GRADHUB_NCCL_IN_PROGRESS(nccl_result)) {                 \
      throw ::gradhub::ddp::CommError(::gradhub::ddp::detail::StrCat(                           \
          "`" #call "` failed: ", ::gradhub::ddp::detail::DescribeNcclResult(nccl_result), " ", \
          ::gradhub::ddp::detail::Where(__FILE__, __LINE__)));                                  \
    }                                                                                           \
  } while (0)

#endif  // GRADHUB_HAVE_NCCL
