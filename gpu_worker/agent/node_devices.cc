#include "gpu_worker/agent/node_devices.h"

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gpu_worker/devices/devices.h"

namespace gradhub::agent {
namespace {

void SetSummary(NodeDevices* devices, const std::string& why_cpu) {
  if (!devices->cuda) {
    devices->summary = absl::StrCat("CPU node (", why_cpu, ")");
    return;
  }
  const v1::DeviceInfo& first = devices->gpus.front();
  devices->summary =
      absl::StrCat("CUDA node: ", devices->gpus.size(), " x ", first.name(), ", ",
                   first.total_memory_bytes() >> 20, " MiB, driver ",
                   first.driver_version().empty() ? "?" : first.driver_version(), ", CUDA ",
                   first.cuda_version().empty() ? "?" : first.cuda_version());
}

}  // namespace

NodeDevices FromInventory(const devices::DeviceInventory& inventory,
                          const char* agent_visible_devices) {
  NodeDevices devices;
  std::vector<std::string> parent;
  if (agent_visible_devices != nullptr) {
    parent = absl::StrSplit(agent_visible_devices, ',', absl::SkipWhitespace());
  }
  for (const devices::GpuInfo& gpu : inventory.gpus) {
    v1::DeviceInfo info;
    info.set_index(static_cast<int32_t>(devices.gpus.size()));
    info.set_name(gpu.name);
    info.set_total_memory_bytes(gpu.total_memory_bytes);
    info.set_compute_capability(gpu.compute_capability);
    info.set_uuid(gpu.uuid);
    info.set_driver_version(inventory.driver_version);
    info.set_cuda_version(inventory.cuda_driver_version);
    // CUDA numbers devices within the agent's own CUDA_VISIBLE_DEVICES; a rank, started with
    // its own, must name the same device as the node sees it.
    const size_t i = devices.gpus.size();
    devices.visible_ids.push_back(i < parent.size() ? parent[i] : absl::StrCat(i));
    devices.gpus.push_back(std::move(info));
  }
  devices.cuda = !devices.gpus.empty();
  SetSummary(&devices, inventory.gpu_unavailable_reason);
  return devices;
}

NodeDevices FakeGpus(int count) {
  NodeDevices devices;
  for (int i = 0; i < count; ++i) {
    v1::DeviceInfo info;
    info.set_index(i);
    info.set_name("Fake GPU (--fake-gpus, for tests only)");
    info.set_total_memory_bytes(int64_t{16} << 30);
    info.set_compute_capability("0.0");
    info.set_uuid(absl::StrCat("GPU-fake-", i));
    info.set_driver_version("fake");
    info.set_cuda_version("fake");
    devices.gpus.push_back(std::move(info));
    devices.visible_ids.push_back(absl::StrCat(i));
  }
  devices.cuda = count > 0;
  SetSummary(&devices, "--fake-gpus 0");
  return devices;
}

NodeDevices DiscoverNodeDevices(int64_t fake_gpus) {
  if (fake_gpus > 0) return FakeGpus(static_cast<int>(fake_gpus));
  return FromInventory(devices::DiscoverDevices(), std::getenv("CUDA_VISIBLE_DEVICES"));
}

}  // namespace gradhub::agent
