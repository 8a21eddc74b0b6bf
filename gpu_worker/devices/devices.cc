#include "gpu_worker/devices/devices.h"

#include "gradhub/build_config.h"

#if GRADHUB_HAVE_CUDA
#include <cuda_runtime.h>
#endif
#if GRADHUB_HAVE_NCCL
#include <nccl.h>
#endif

#include <cstdio>
#include <fstream>
#include <regex>

namespace gradhub::devices {
namespace {

#if GRADHUB_HAVE_CUDA
// The kernel module's version, which nvidia-smi calls the driver version: the CUDA runtime
// only knows the CUDA version the driver supports. Read from the file the module publishes,
// so no NVML is linked: "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  ...", or
// "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.54.15  ..." for the open one.
std::string KernelDriverVersion() {
  std::ifstream in("/proc/driver/nvidia/version");
  std::string line;
  if (!std::getline(in, line)) return "";
  std::smatch match;
  static const std::regex kVersion(R"(Kernel Module(?: for \S+)?\s+([0-9]+\.[0-9.]+))");
  return std::regex_search(line, match, kVersion) ? match[1].str() : "";
}

std::string FormatUuid(const cudaUUID_t& uuid) {
  // The same spelling as nvidia-smi -L, so operators can match devices.
  std::string text = "GPU-";
  char byte[3];
  for (int i = 0; i < 16; ++i) {
    std::snprintf(byte, sizeof(byte), "%02x", static_cast<unsigned char>(uuid.bytes[i]));
    text += byte;
    if (i == 3 || i == 5 || i == 7 || i == 9) text += '-';
  }
  return text;
}
#endif

}  // namespace

DeviceInventory DiscoverDevices() {
  DeviceInventory inventory;
#if GRADHUB_HAVE_NCCL
  inventory.nccl_built = true;
  if (ncclGetVersion(&inventory.nccl_version) != ncclSuccess) inventory.nccl_version = 0;
#endif
#if GRADHUB_HAVE_CUDA
  inventory.cuda_built = true;
  inventory.driver_version = KernelDriverVersion();
  if (int version = 0; cudaDriverGetVersion(&version) == cudaSuccess && version > 0) {
    inventory.cuda_driver_version =
        std::to_string(version / 1000) + "." + std::to_string(version % 1000 / 10);
  }
  int count = 0;
  cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    inventory.gpu_unavailable_reason =
        std::string("cudaGetDeviceCount: ") + cudaGetErrorString(error);
    return inventory;
  }
  for (int index = 0; index < count; ++index) {
    cudaDeviceProp properties{};
    if (cudaGetDeviceProperties(&properties, index) != cudaSuccess) continue;
    GpuInfo gpu;
    gpu.index = index;
    gpu.name = properties.name;
    gpu.uuid = FormatUuid(properties.uuid);
    gpu.total_memory_bytes = static_cast<int64_t>(properties.totalGlobalMem);
    gpu.compute_capability =
        std::to_string(properties.major) + "." + std::to_string(properties.minor);
    inventory.gpus.push_back(gpu);
  }
  if (inventory.gpus.empty()) inventory.gpu_unavailable_reason = "no CUDA device visible";
#else
  inventory.gpu_unavailable_reason = "this build has no CUDA support";
#endif
  return inventory;
}

}  // namespace gradhub::devices
