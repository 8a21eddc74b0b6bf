// The factories of the ProcessGroup seam: the only place that knows which backends exist, and
// the one check of their options.
#include "gpu_worker/ddp/comm/process_group.h"

#include <ATen/ops/zeros.h>

#include <algorithm>
#include <stdexcept>

#include "gpu_worker/ddp/comm/checks.h"
#include "gpu_worker/ddp/comm/gloo/gloo_process_group.h"
#include "gradhub/build_config.h"

#if GRADHUB_HAVE_NCCL
#include "gpu_worker/ddp/comm/nccl/nccl_process_group.h"
#endif

namespace gradhub::ddp {
namespace {

// The settings of the backend that was not chosen: refused rather than ignored.
void CheckNoForeignOptions(const ProcessGroupOptions& options, const std::string& who) {
  const char* backend = BackendName(options.backend);
  GRADHUB_ARG_CHECK(!(options.backend != Backend::kGloo && options.gloo), who,
                    ": options.gloo is set, but the backend is ", backend,
                    " (Gloo settings apply only to Backend::kGloo)");
  GRADHUB_ARG_CHECK(!(options.backend != Backend::kNccl && options.nccl), who,
                    ": options.nccl is set, but the backend is ", backend,
                    " (NCCL settings apply only to Backend::kNccl)");
}

}  // namespace

at::Tensor ProcessGroup::AllocateCollectiveBuffer(int64_t numel, const at::TensorOptions& options) {
  return at::zeros({numel}, options);
}

const char* BackendName(Backend backend) {
  switch (backend) {
    case Backend::kGloo:
      return "gloo";
    case Backend::kNccl:
      return "nccl";
  }
  return "unknown";
}

void ValidateProcessGroupOptions(const ProcessGroupOptions& options) {
  const std::string who =
      detail::StrCat("process group '", options.name, "' rank ", options.rank, "/", options.size);
  GRADHUB_ARG_CHECK(options.backend == Backend::kGloo || options.backend == Backend::kNccl, who,
                    ": options.backend ", static_cast<int>(options.backend), " is not a backend");
  GRADHUB_ARG_CHECK(options.size >= 1, who, ": options.size must be >= 1, got ", options.size);
  GRADHUB_ARG_CHECK(options.rank >= 0 && options.rank < options.size, who, ": options.rank ",
                    options.rank, " is not in [0, ", options.size, ")");
  GRADHUB_ARG_CHECK(options.store != nullptr, who, ": options.store is null");
  GRADHUB_ARG_CHECK(!options.name.empty(), who, ": options.name is empty");
  GRADHUB_ARG_CHECK(options.timeout.count() > 0, who, ": options.timeout must be positive, got ",
                    options.timeout.count(), " ms");
  CheckNoForeignOptions(options, who);
  if (options.gloo) {
    GRADHUB_ARG_CHECK(options.gloo->channels >= 1, who,
                      ": options.gloo.channels must be >= 1, got ", options.gloo->channels);
  }
  if (options.nccl) {
    GRADHUB_ARG_CHECK(options.nccl->device >= 0, who, ": options.nccl.device must be >= 0, got ",
                      options.nccl->device);
  }
}

std::shared_ptr<ProcessGroup> CreateProcessGroup(const ProcessGroupOptions& options) {
  ValidateProcessGroupOptions(options);
  if (options.backend == Backend::kGloo) return std::make_shared<GlooProcessGroup>(options);
#if GRADHUB_HAVE_NCCL
  return std::make_shared<NcclProcessGroup>(options);
#else
  throw CommError(detail::StrCat(
      "process group '", options.name, "' rank ", options.rank, "/", options.size,
      ": the NCCL backend was requested, but this build has no NCCL (CUDA runtime and "
      "nccl.h were not found at configure time; see cmake/GradhubCuda.cmake)"));
#endif
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

  ProcessGroupOptions options = parent_options;  // same backend, store, timeout, settings
  options.rank = static_cast<int>(it - ranks.begin());
  options.size = static_cast<int>(ranks.size());
  options.name = parent_options.name + "/sub";  // e.g. "default/sub-0-2"
  for (int member : ranks) options.name += "-" + std::to_string(member);
  return CreateProcessGroup(options);
}

}  // namespace gradhub::ddp
