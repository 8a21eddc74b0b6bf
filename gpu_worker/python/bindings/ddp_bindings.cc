// The Reducer over a Python module's parameters, the comm hooks, and the helpers
// gradhub.DistributedDataParallel calls at construction and before each forward.
#include <torch/csrc/utils/pybind.h>

#include <memory>
#include <string>
#include <vector>

#include "gpu_worker/ddp/comm_hook.h"
#include "gpu_worker/ddp/distributed_data_parallel.h"
#include "gpu_worker/ddp/powersgd.h"
#include "gpu_worker/ddp/reducer.h"
#include "gpu_worker/python/bindings/bindings.h"

namespace py = pybind11;

namespace gradhub::python {
namespace {

using Seconds = std::chrono::duration<double>;

std::unique_ptr<ddp::Reducer> MakeReducer(std::vector<at::Tensor> parameters,
                                          std::vector<std::string> names,
                                          std::shared_ptr<ddp::ProcessGroup> group,
                                          int64_t bucket_cap_bytes, int64_t first_bucket_bytes,
                                          bool find_unused_parameters,
                                          std::shared_ptr<ddp::CommHook> comm_hook) {
  if (!group) throw py::value_error("group: must be a ProcessGroup, not None");
  if (bucket_cap_bytes <= 0 || first_bucket_bytes <= 0) {
    throw py::value_error("bucket_cap_bytes and first_bucket_bytes: must be positive");
  }
  ddp::ReducerOptions options;
  options.bucket_cap_bytes = bucket_cap_bytes;
  options.first_bucket_bytes = first_bucket_bytes;
  options.find_unused_parameters = find_unused_parameters;
  options.comm_hook = std::move(comm_hook);
  options.finalize_at_end_of_backward = true;
  return std::make_unique<ddp::Reducer>(std::move(parameters), std::move(names), std::move(group),
                                        std::move(options));
}

py::dict StatsOf(const ddp::Reducer& reducer) {
  const ddp::ReductionStats& stats = reducer.last_stats();
  py::dict result;
  result["buckets"] = stats.buckets;
  result["bytes"] = stats.bytes;
  result["wait_seconds"] = std::chrono::duration_cast<Seconds>(stats.wait).count();
  result["allreduce_seconds"] = std::chrono::duration_cast<Seconds>(stats.allreduce).count();
  return result;
}

void BindReducer(py::module_& module) {
  py::class_<ddp::Reducer>(module, "Reducer")
      .def(py::init(&MakeReducer), py::arg("parameters"), py::arg("names"), py::arg("group"),
           py::arg("bucket_cap_bytes"), py::arg("first_bucket_bytes"),
           py::arg("find_unused_parameters"), py::arg("comm_hook") = nullptr)
      .def("prepare", &ddp::Reducer::Prepare, py::arg("outputs"),
           py::call_guard<py::gil_scoped_release>())
      .def("zero_grad", &ddp::Reducer::ZeroGrad, py::call_guard<py::gil_scoped_release>())
      .def("set_comm_hook", &ddp::Reducer::SetCommHook, py::arg("hook"))
      .def("bucket_assignment", &ddp::Reducer::bucket_assignment)
      .def("last_stats", &StatsOf);
}

void BindCommHooks(py::module_& module) {
  py::class_<ddp::CommHook, std::shared_ptr<ddp::CommHook>>(module, "CommHook")
      .def_property_readonly("name", &ddp::CommHook::name)
      .def("__repr__",
           [](const ddp::CommHook& hook) { return "<gradhub comm hook " + hook.name() + ">"; });
  module.def("fp16_compress", [] {
    return std::shared_ptr<ddp::CommHook>(std::make_shared<ddp::CastCompressHook>(at::kHalf));
  });
  module.def("bf16_compress", [] {
    return std::shared_ptr<ddp::CommHook>(std::make_shared<ddp::CastCompressHook>(at::kBFloat16));
  });
  module.def(
      "powersgd",
      [](int64_t rank, int64_t start_iter, double min_compression_rate, bool error_feedback,
         bool warm_start, uint64_t seed) {
        ddp::PowerSgdOptions options{.matrix_approximation_rank = rank,
                                     .start_iter = start_iter,
                                     .min_compression_rate = min_compression_rate,
                                     .error_feedback = error_feedback,
                                     .warm_start = warm_start,
                                     .seed = seed};
        return std::shared_ptr<ddp::CommHook>(std::make_shared<ddp::PowerSgdHook>(options));
      },
      py::arg("matrix_approximation_rank") = 1, py::arg("start_iter") = 10,
      py::arg("min_compression_rate") = 2.0, py::arg("error_feedback") = true,
      py::arg("warm_start") = true, py::arg("seed") = 0);
}

}  // namespace

void BindDdp(py::module_& module) {
  BindReducer(module);
  BindCommHooks(module);
  module.def(
      "verify_same_parameters",
      [](ddp::ProcessGroup& group, const std::vector<std::string>& names,
         const std::vector<at::Tensor>& parameters) {
        ddp::VerifySameParameters(group, names, parameters);
      },
      py::arg("group"), py::arg("names"), py::arg("parameters"),
      py::call_guard<py::gil_scoped_release>());
  module.def(
      "broadcast_coalesced",
      [](ddp::ProcessGroup& group, const std::vector<at::Tensor>& tensors, int src) {
        ddp::BroadcastCoalesced(group, tensors, src);
      },
      py::arg("group"), py::arg("tensors"), py::arg("src") = 0,
      py::call_guard<py::gil_scoped_release>());
}

}  // namespace gradhub::python
