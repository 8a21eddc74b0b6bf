#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace gradhub::devices {

struct GpuInfo {
  int index = 0;
  std::string name;
  std::string uuid;
  int64_t total_memory_bytes = 0;
  std::string compute_capability;  // "9.0"
};

// What this build can drive and this machine has. Safe to call anywhere: without CUDA in
// the build, or without a driver or device at run time, the GPU list is empty and
// `gpu_unavailable_reason` says why (shown by the agent and by skipped GPU tests).
struct DeviceInventory {
  bool cuda_built = false;
  bool nccl_built = false;
  int nccl_version = 0;  // NCCL_VERSION_CODE-style number of the linked library, 0 without
  std::vector<GpuInfo> gpus;
  std::string gpu_unavailable_reason;
  // Node-wide, empty when unknown: the NVIDIA kernel driver ("550.54.15", from
  // /proc/driver/nvidia/version) and the newest CUDA version it supports ("12.4").
  std::string driver_version;
  std::string cuda_driver_version;
};

DeviceInventory DiscoverDevices();

}  // namespace gradhub::devices
