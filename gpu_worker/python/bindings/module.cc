#include <pybind11/pybind11.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "gpu_worker/python/bindings/bindings.h"
#include "gradhub/build_config.h"

#ifndef GRADHUB_TORCH_VERSION
#error "GRADHUB_TORCH_VERSION: the CMake build defines it (gpu_worker/python/CMakeLists.txt)"
#endif

namespace py = pybind11;

namespace gradhub::python {

std::chrono::milliseconds TimeoutArgument(const py::object& value, const char* field,
                                          std::chrono::milliseconds fallback) {
  if (value.is_none()) return fallback;
  double seconds = 0;
  const py::object timedelta = py::module_::import("datetime").attr("timedelta");
  if (py::isinstance(value, timedelta)) {
    seconds = value.attr("total_seconds")().cast<double>();
  } else if ((py::isinstance<py::float_>(value) || py::isinstance<py::int_>(value)) &&
             !py::isinstance<py::bool_>(value)) {
    seconds = value.cast<double>();
  } else {
    throw py::type_error(std::string(field) +
                         ": must be seconds (a number) or a datetime.timedelta");
  }
  if (!std::isfinite(seconds) || seconds <= 0) {
    throw py::value_error(std::string(field) + ": must be positive, not " +
                          py::repr(value).cast<std::string>());
  }
  // At least 1 ms: a positive timeout must not read as "the default" (zero) downstream.
  return std::chrono::milliseconds(std::max<int64_t>(1, std::llround(seconds * 1000)));
}

}  // namespace gradhub::python

PYBIND11_MODULE(_C, module) {
  module.doc() = "gradhub's C++ engine (gpu_worker/ddp): process groups, collectives, Reducer";
  module.attr("TORCH_VERSION") = GRADHUB_TORCH_VERSION;
  module.attr("CXX11_ABI") = static_cast<bool>(_GLIBCXX_USE_CXX11_ABI);
  module.attr("HAS_NCCL") = static_cast<bool>(GRADHUB_HAVE_NCCL);
  gradhub::python::BindStores(module);
  gradhub::python::BindProcessGroup(module);
  gradhub::python::BindDdp(module);
}
