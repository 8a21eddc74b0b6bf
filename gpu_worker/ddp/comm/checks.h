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
// The checks of a collective's operands are in collective_checks.h.
#pragma once

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
