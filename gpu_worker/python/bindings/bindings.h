// gradhub._C, the C++ engine as a Python extension: what each translation unit adds to the
// module. Split so that the one that needs gRPC (the platform store's client) does not include
// torch, and the ones that include torch's pybind11 casters do not include gRPC.
#pragma once

#include <pybind11/pybind11.h>

#include <chrono>
#include <optional>

namespace gradhub::python {

// Stores: tcp_store (torch's TCPStore), file_store, platform_store (gradhub-api's
// StoreService), and the exceptions RendezvousError. store_bindings.cc.
void BindStores(pybind11::module_& module);
// ProcessGroup, Work, Backend, ReduceOp and CollectiveError. process_group_bindings.cc.
void BindProcessGroup(pybind11::module_& module);
// Reducer, the comm hooks, verify_same_parameters, broadcast_coalesced. ddp_bindings.cc.
void BindDdp(pybind11::module_& module);

// A Python timeout (float seconds or datetime.timedelta) in milliseconds; ValueError naming
// `field` unless positive. None gives `fallback`.
std::chrono::milliseconds TimeoutArgument(const pybind11::object& value, const char* field,
                                          std::chrono::milliseconds fallback);

}  // namespace gradhub::python
