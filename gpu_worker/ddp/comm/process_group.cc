// The factories of the ProcessGroup seam: the only place that knows which backends exist.
#include "gpu_worker/ddp/comm/process_group.h"

#include <algorithm>
#include <stdexcept>

#include "gpu_worker/ddp/comm/checks.h"
#include "gpu_worker/ddp/comm/gloo/gloo_process_group.h"
#include "gradhub/build_config.h"

#if GRADHUB_HAVE_NCCL
#include "gpu_worker/ddp/comm/nccl/nccl_process_group.h"
#endif

namespace gradhub::ddp {

std::shared_ptr<ProcessGroup> CreateProcessGroup(const ProcessGroupOptions& options) {
  switch (options.backend) {
    case Backend::kGloo:
      return std::make_shared<GlooProcessGroup>(options);
    case Backend::kNccl:
#if GRADHUB_HAVE_NCCL
      return std::make_shared<NcclProcessGroup>(options);
#else
      throw CommError(detail::StrCat(
          "process group '", options.name, "' rank ", options.rank, "/", options.size,
          ": the NCCL backend was requested, but this build has no NCCL (CUDA runtime and "
          "nccl.h were not found at configure time; see cmake/GradhubCuda.cmake)"));
#endif
  }
  throw std::invalid_argument("CreateProcessGroup: unknown backend");
}

std::shared_ptr<ProcessGroup> CreateSubgroup(const ProcessGroupOptions& parent_options,
                                             const std::vector<int>& ranks) {
  const std::string where =
      detail::StrCat("CreateSubgroup of group '", parent_options.name, "' rank ",
                     parent_options.rank, "/", parent_options.size);
  GRADHUB_ARG_CHECK(!ranks.empty(), where, ": ranks is empty");
  for (size_t i = 0; i < ranks.size(); ++i) {
    GRADHUB_ARG_CHECK(ranks[i] >= 0 && ranks[i] < parent_options.size, where, ": rank ", ranks[i],
                      " is not in [0, ", parent_options.size, ")");
    GRADHUB_ARG_CHECK(i == 0 || ranks[i - 1] < ranks[i], where,
                      ": ranks must be sorted and unique");
  }
  const auto it = std::find(ranks.begin(), ranks.end(), parent_options.rank);
  if (it == ranks.end()) return nullptr;

  ProcessGroupOptions options = parent_options;  // same backend, store, timeout, channels
  options.rank = static_cast<int>(it - ranks.begin());
  options.size = static_cast<int>(ranks.size());
  options.name = parent_options.name + "/sub";  // e.g. "default/sub-0-2"
  for (int member : ranks) options.name += "-" + std::to_string(member);
  return CreateProcessGroup(options);
}

}  // namespace gradhub::ddp
