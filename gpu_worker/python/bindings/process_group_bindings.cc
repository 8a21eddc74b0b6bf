// ProcessGroup and Work over torch tensors. Every call that may block (the rendezvous,
// Work.wait) releases the GIL, so other Python threads run and a collective's own threads,
// which never take the GIL, finish it.
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include <memory>
#include <string>
#include <vector>

#include "gpu_worker/ddp/comm/gloo/gloo_process_group.h"
#include "gpu_worker/ddp/comm/process_group.h"
#include "gpu_worker/ddp/comm/work.h"
#include "gpu_worker/python/bindings/bindings.h"

namespace py = pybind11;

namespace gradhub::python {
namespace {

// A collective's Work, holding its tensors so they live (as the engine requires) until it
// completes even if the caller drops them.
struct PyWork {
  std::shared_ptr<ddp::Work> work;
  py::object tensors;
};

PyWork Launch(std::shared_ptr<ddp::Work> work, py::object tensors) {
  return PyWork{std::move(work), std::move(tensors)};
}

void Wait(PyWork& handle, const py::object& timeout) {
  const auto limit = TimeoutArgument(timeout, "timeout", std::chrono::milliseconds::zero());
  {
    py::gil_scoped_release unlocked;
    handle.work->Wait(limit);
  }
  handle.tensors = py::none();  // done: the engine no longer reads or writes them
}

std::shared_ptr<ddp::ProcessGroup> Join(const std::shared_ptr<ddp::Store>& store, int rank,
                                        int size, ddp::Backend backend, const std::string& name,
                                        const py::object& timeout, bool shared_memory,
                                        const std::string& hostname, int device,
                                        bool encrypt_traffic) {
  if (!store) throw py::value_error("store: must be a gradhub Store, not None");
  ddp::ProcessGroupOptions options;
  options.backend = backend;
  options.rank = rank;
  options.size = size;
  options.store = store;
  options.name = name;
  options.timeout = TimeoutArgument(timeout, "timeout", ddp::kDefaultCollectiveTimeout);
  if (backend == ddp::Backend::kGloo) {
    if (device != 0) throw py::value_error("device: is NCCL's setting, but the backend is gloo");
    ddp::GlooOptions gloo;
    gloo.hostname = hostname;
    gloo.shared_memory = shared_memory;
    gloo.encrypt_traffic = encrypt_traffic;
    options.gloo = gloo;
  } else {
    if (!shared_memory || !hostname.empty() || encrypt_traffic) {
      throw py::value_error(
          "shared_memory, hostname and encrypt_traffic: are Gloo's settings, but the backend "
          "is nccl");
    }
    options.nccl = ddp::NcclOptions{.device = device};
  }
  ddp::ValidateProcessGroupOptions(options);
  py::gil_scoped_release unlocked;
  try {
    return ddp::CreateProcessGroup(options);
  } catch (const ddp::CommError& error) {
    // Failing to join is a rendezvous failure (a rank never came, the store went away).
    throw ddp::StoreTimeoutError(error.what());
  }
}

ddp::Backend BackendOf(const ddp::ProcessGroup& group) {
  return dynamic_cast<const ddp::GlooProcessGroup*>(&group) ? ddp::Backend::kGloo
                                                            : ddp::Backend::kNccl;
}

void BindEnums(py::module_& module) {
  py::enum_<ddp::Backend>(module, "Backend")
      .value("GLOO", ddp::Backend::kGloo)
      .value("NCCL", ddp::Backend::kNccl);
  py::enum_<ddp::ReduceOp>(module, "ReduceOp")
      .value("SUM", ddp::ReduceOp::kSum)
      .value("AVG", ddp::ReduceOp::kAverage)
      .value("MAX", ddp::ReduceOp::kMax)
      .value("MIN", ddp::ReduceOp::kMin);
}

void BindWork(py::module_& module) {
  py::class_<PyWork>(module, "Work")
      .def("wait", &Wait, py::arg("timeout") = py::none(),
           "Blocks until the collective completed; CollectiveError if it failed or `timeout` "
           "(seconds or a timedelta; default: the group's) passed first.")
      .def("is_completed", [](const PyWork& handle) { return handle.work->IsCompleted(); })
      .def("__repr__", [](const PyWork& handle) {
        return "<gradhub Work " + handle.work->description() + ">";
      });
}

py::object TensorList(const std::vector<at::Tensor>& tensors) { return py::cast(tensors); }

void BindCollectives(py::class_<ddp::ProcessGroup, std::shared_ptr<ddp::ProcessGroup>>& group) {
  group
      .def(
          "all_reduce",
          [](ddp::ProcessGroup& g, const at::Tensor& tensor, ddp::ReduceOp op) {
            return Launch(g.AllReduce(tensor, op), py::cast(tensor));
          },
          py::arg("tensor"), py::arg("op") = ddp::ReduceOp::kSum,
          "Reduces `tensor` across the group's ranks, in place.")
      .def(
          "broadcast",
          [](ddp::ProcessGroup& g, const py::object& tensors, int src) {
            if (src < 0 || src >= g.size()) {
              throw py::value_error("src: " + std::to_string(src) + " is not a rank of group '" +
                                    g.name() + "' (0 to " + std::to_string(g.size() - 1) + ")");
            }
            std::vector<at::Tensor> list = THPVariable_Check(tensors.ptr())
                                               ? std::vector<at::Tensor>{tensors.cast<at::Tensor>()}
                                               : tensors.cast<std::vector<at::Tensor>>();
            return Launch(g.Broadcast(list, src), TensorList(list));
          },
          py::arg("tensors"), py::arg("src") = 0,
          "Copies rank `src`'s tensor (or list of tensors) to every rank, in place.")
      .def(
          "all_gather",
          [](ddp::ProcessGroup& g, const std::vector<at::Tensor>& outputs,
             const at::Tensor& input) {
            std::vector<at::Tensor> all = outputs;
            all.push_back(input);
            return Launch(g.AllGather(outputs, input), TensorList(all));
          },
          py::arg("output_tensors"), py::arg("input_tensor"),
          "output_tensors[r] receives rank r's input_tensor.")
      .def(
          "barrier", [](ddp::ProcessGroup& g) { return Launch(g.Barrier(), py::none()); },
          "Completes once every rank of the group has entered it.");
}

}  // namespace

void BindProcessGroup(py::module_& module) {
  static py::exception<ddp::CommError> collective_error(module, "CollectiveError",
                                                        PyExc_RuntimeError);
  py::register_exception_translator([](std::exception_ptr error) {
    try {
      if (error) std::rethrow_exception(error);
    } catch (const ddp::CommError& e) {
      collective_error(e.what());
    }
  });
  BindEnums(module);
  BindWork(module);
  py::class_<ddp::ProcessGroup, std::shared_ptr<ddp::ProcessGroup>> group(module, "ProcessGroup");
  group
      .def(py::init(&Join), py::arg("store"), py::arg("rank"), py::arg("size"),
           py::arg("backend") = ddp::Backend::kGloo, py::arg("name") = "default",
           py::arg("timeout") = py::none(), py::arg("shared_memory") = true,
           py::arg("hostname") = "", py::arg("device") = 0, py::arg("encrypt_traffic") = false)
      .def_property_readonly("rank", &ddp::ProcessGroup::rank)
      .def_property_readonly("size", &ddp::ProcessGroup::size)
      .def_property_readonly("name", &ddp::ProcessGroup::name)
      .def_property_readonly("backend", &BackendOf)
      .def("__repr__", [](const ddp::ProcessGroup& g) {
        return "<gradhub ProcessGroup '" + g.name() + "' rank " + std::to_string(g.rank()) + "/" +
               std::to_string(g.size()) + " " + ddp::BackendName(BackendOf(g)) + ">";
      });
  BindCollectives(group);
}

}  // namespace gradhub::python
