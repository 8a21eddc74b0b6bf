// The ProcessGroup conformance suite (tests/unit/ddp/process_group_conformance.h) against
// NCCL. Ranks are threads of this process with one GPU each (rank r on cuda:r), so a machine
// with one GPU runs the world-of-one cases and skips the others, naming the reason; where no
// GPU is visible or the build has no NCCL every test is skipped. tests/gpu/run.sh runs it on
// a GPU machine; ctest runs it everywhere else, where it shows the skips.
//
// Tensors are device memory from cudaMalloc wrapped by at::from_blob (which needs only ATen's
// tensor metadata), so this builds and runs against Debian's CPU-only libtorch as well as
// against a CUDA one.
#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <stdexcept>
#include <string>

#include "gpu_worker/ddp/comm/process_group.h"
#include "gpu_worker/ddp/store/in_memory_store.h"
#include "gpu_worker/devices/devices.h"
#include "gradhub/build_config.h"
#include "tests/unit/ddp/process_group_conformance.h"

#if GRADHUB_HAVE_NCCL
#include <cuda_runtime.h>
#endif

namespace gradhub::ddp {
namespace {

std::string NcclUnavailable() {
#if !GRADHUB_HAVE_NCCL
  return "this build has no NCCL (cmake/GradhubCuda.cmake found no CUDA runtime or nccl.h)";
#else
  const devices::DeviceInventory inventory = devices::DiscoverDevices();
  if (!inventory.gpus.empty()) return "";
  return inventory.gpu_unavailable_reason.empty() ? "no GPU visible"
                                                  : inventory.gpu_unavailable_reason;
#endif
}

int VisibleGpus() { return static_cast<int>(devices::DiscoverDevices().gpus.size()); }

#if GRADHUB_HAVE_NCCL

void Check(cudaError_t result, const char* call) {
  if (result != cudaSuccess) {
    throw std::runtime_error(std::string(call) + ": " + cudaGetErrorString(result));
  }
}

at::Tensor ToDevice(const at::Tensor& host, int rank) {
  const at::Tensor contiguous = host.contiguous();
  Check(cudaSetDevice(rank), "cudaSetDevice");
  void* memory = nullptr;
  Check(cudaMalloc(&memory, std::max<size_t>(contiguous.nbytes(), 1)), "cudaMalloc");
  Check(cudaMemcpy(memory, contiguous.data_ptr(), contiguous.nbytes(), cudaMemcpyHostToDevice),
        "cudaMemcpy to the device");
  return at::from_blob(
      memory, contiguous.sizes(), [](void* p) { cudaFree(p); },
      at::TensorOptions()
          .dtype(contiguous.scalar_type())
          .device(at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(rank))));
}

at::Tensor ToHost(const at::Tensor& tensor) {
  if (!tensor.is_contiguous()) throw std::invalid_argument("ToHost: tensor is not contiguous");
  at::Tensor host = at::empty(tensor.sizes(), at::TensorOptions().dtype(tensor.scalar_type()));
  Check(cudaMemcpy(host.data_ptr(), tensor.data_ptr(), host.nbytes(), cudaMemcpyDeviceToHost),
        "cudaMemcpy to the host");
  return host;
}

#else

at::Tensor ToDevice(const at::Tensor&, int) { throw std::logic_error("no CUDA in this build"); }
at::Tensor ToHost(const at::Tensor&) { throw std::logic_error("no CUDA in this build"); }

#endif

ProcessGroupBackend NcclBackend() {
  ProcessGroupBackend backend;
  backend.name = "Nccl";
  backend.unavailable = NcclUnavailable;
  backend.max_world = VisibleGpus;
  backend.options = [](int rank, int) {
    ProcessGroupOptions options;
    options.backend = Backend::kNccl;
    options.nccl = NcclOptions{rank};  // one GPU per rank
    return options;
  };
  backend.to_device = ToDevice;
  backend.to_host = ToHost;
  backend.foreign_device = c10::Device(c10::kCPU);
  return backend;
}

INSTANTIATE_TEST_SUITE_P(Nccl, ProcessGroupConformanceTest, ::testing::Values(NcclBackend()),
                         ProcessGroupBackendName);

TEST(NcclProcessGroupTest, RefusesADeviceThatIsNotVisible) {
  const std::string reason = NcclUnavailable();
  if (!reason.empty()) GTEST_SKIP() << reason;
  ProcessGroupOptions options;
  options.backend = Backend::kNccl;
  options.store = std::make_shared<InMemoryStore>();
  options.name = "nccl-device";
  options.nccl = NcclOptions{VisibleGpus()};
  try {
    CreateProcessGroup(options);
    FAIL() << "expected CommError";
  } catch (const CommError& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("process group 'nccl-device' rank 0/1: "
                                               "options.nccl.device " +
                                               std::to_string(VisibleGpus()) + " does not exist"));
  }
}

}  // namespace
}  // namespace gradhub::ddp
