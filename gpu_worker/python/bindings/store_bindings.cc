// The rendezvous stores. No torch here and no gRPC headers: the platform store's client is a
// factory (grpc_store.h) compiled in its own library.
#include <pybind11/pybind11.h>

#include <memory>
#include <string>

#include "gpu_worker/ddp/store.h"
#include "gpu_worker/ddp/store/file_store.h"
#include "gpu_worker/ddp/store/prefix_store.h"
#include "gpu_worker/ddp/store/tcp_store.h"
#include "gpu_worker/python/bindings/bindings.h"
#if GRADHUB_PYTHON_PLATFORM_STORE
#include "gpu_worker/store_client/grpc_store.h"
#endif

namespace py = pybind11;

namespace gradhub::python {
namespace {

std::shared_ptr<ddp::Store> TcpStore(const std::string& host, int port, int world_size,
                                     bool is_server, const py::object& timeout) {
  ddp::TcpStoreOptions options;
  options.host = host;
  options.port = port;
  options.world_size = world_size;
  options.is_server = is_server;
  options.timeout = TimeoutArgument(timeout, "timeout", ddp::kDefaultStoreTimeout);
  py::gil_scoped_release unlocked;  // a client waits for the server to come up
  return ddp::MakeTcpStore(options);
}

std::shared_ptr<ddp::Store> PlatformStore(const std::string& address, const std::string& token,
                                          const std::string& prefix,
                                          const std::string& tls_ca_file) {
  if (address.empty()) throw py::value_error("address: must be host:port of gradhub-api");
  if (prefix.empty()) throw py::value_error("prefix: must name the attempt's keys");
#if GRADHUB_PYTHON_PLATFORM_STORE
  store_client::GrpcStoreOptions options;
  options.token = token;
  options.tls_ca_file = tls_ca_file;
  return std::make_shared<ddp::PrefixStore>(store_client::MakeGrpcStore(address, options), prefix);
#else
  throw ddp::StoreError(
      "platform_store: this build of gradhub has no gRPC client (a node build without gRPC); "
      "rendezvous through tcp:// or MASTER_ADDR/MASTER_PORT instead");
#endif
}

void BindStoreClass(py::module_& module) {
  py::class_<ddp::Store, std::shared_ptr<ddp::Store>>(module, "Store")
      .def(
          "set",
          [](ddp::Store& store, const std::string& key, const std::string& value) {
            store.Set(key, value);
          },
          py::arg("key"), py::arg("value"), py::call_guard<py::gil_scoped_release>())
      .def(
          "get",
          [](ddp::Store& store, const std::string& key, const py::object& timeout) {
            const auto wait = TimeoutArgument(timeout, "timeout", ddp::kDefaultStoreTimeout);
            std::string value;
            {
              py::gil_scoped_release unlocked;
              value = store.Get(key, wait);
            }
            return py::bytes(value);
          },
          py::arg("key"), py::arg("timeout") = py::none())
      .def(
          "add",
          [](ddp::Store& store, const std::string& key, int64_t delta) {
            return store.Add(key, delta);
          },
          py::arg("key"), py::arg("delta"), py::call_guard<py::gil_scoped_release>());
}

}  // namespace

void BindStores(py::module_& module) {
  // A rendezvous that did not complete: a key (a rank) never came, or the store is unreachable.
  static py::exception<ddp::StoreTimeoutError> rendezvous_error(module, "RendezvousError",
                                                                PyExc_RuntimeError);
  py::register_exception_translator([](std::exception_ptr error) {
    try {
      if (error) std::rethrow_exception(error);
    } catch (const ddp::StoreTimeoutError& e) {
      rendezvous_error(e.what());
    } catch (const ddp::StoreError& e) {
      rendezvous_error(e.what());
    }
  });
  BindStoreClass(module);
  module.def("tcp_store", &TcpStore, py::arg("host"), py::arg("port"), py::arg("world_size"),
             py::arg("is_server"), py::arg("timeout") = py::none());
  module.def(
      "file_store",
      [](const std::string& path) -> std::shared_ptr<ddp::Store> {
        return std::make_shared<ddp::FileStore>(path);
      },
      py::arg("path"));
  module.def("platform_store", &PlatformStore, py::arg("address"), py::arg("token"),
             py::arg("prefix"), py::arg("tls_ca_file") = "");
}

}  // namespace gradhub::python
