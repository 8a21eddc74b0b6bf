#include <pybind11/pybind11.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <string_view>

#include "gpu_worker/python/bindings/bindings.h"
#include "gradhub/build_config.h"
#include "services/common/crc32c.h"

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

namespace {

// gradhub.crc32c(data, crc=0): the CRC-32C of `data` (any contiguous buffer: bytes, bytearray,
// memoryview) continuing `crc`, by ISA-L without the GIL. The `gradhub` module's checkpoint
// client checks its uploads and downloads with it where this engine is loaded (_checksums.py):
// a tenth of SHA-256's CPU on the training node.
uint32_t Crc32cOf(const py::object& data, uint32_t crc) {
  Py_buffer view;
  if (PyObject_GetBuffer(data.ptr(), &view, PyBUF_SIMPLE) != 0) throw py::error_already_set();
  const std::unique_ptr<Py_buffer, void (*)(Py_buffer*)> release(&view, PyBuffer_Release);
  const std::string_view bytes(static_cast<const char*>(view.buf), static_cast<size_t>(view.len));
  py::gil_scoped_release unlocked;
  return Crc32cExtend(crc, bytes);
}

}  // namespace
}  // namespace gradhub::python

PYBIND11_MODULE(_C, module) {
  module.doc() = "gradhub's C++ engine (gpu_worker/ddp): process groups, collectives, Reducer";
  module.attr("TORCH_VERSION") = GRADHUB_TORCH_VERSION;
  module.attr("CXX11_ABI") = static_cast<bool>(_GLIBCXX_USE_CXX11_ABI);
  module.attr("HAS_NCCL") = static_cast<bool>(GRADHUB_HAVE_NCCL);
  gradhub::python::BindStores(module);
  gradhub::python::BindProcessGroup(module);
  gradhub::python::BindDdp(module);
  module.def("crc32c", &gradhub::python::Crc32cOf, py::arg("data"), py::arg("crc") = 0,
             "The CRC-32C (Castagnoli) of a contiguous buffer, continuing `crc`.");
}
