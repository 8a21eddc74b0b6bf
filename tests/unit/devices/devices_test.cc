#include "gpu_worker/devices/devices.h"

#include <gtest/gtest.h>

#include "gradhub/build_config.h"
#if GRADHUB_HAVE_NCCL
#include <nccl.h>
#endif

namespace gradhub::devices {
namespace {

TEST(DevicesTest, InventoryMatchesTheBuild) {
  DeviceInventory inventory = DiscoverDevices();
  EXPECT_EQ(inventory.cuda_built, GRADHUB_HAVE_CUDA == 1);
  EXPECT_EQ(inventory.nccl_built, GRADHUB_HAVE_NCCL == 1);
#if GRADHUB_HAVE_NCCL
  // The NCCL library we linked is the one whose header we compiled against.
  EXPECT_EQ(inventory.nccl_version / 100, NCCL_VERSION_CODE / 100);
#endif
  // Either GPUs were found or the inventory says why not; never an empty story.
  EXPECT_NE(inventory.gpus.empty(), inventory.gpu_unavailable_reason.empty());
}

TEST(DevicesTest, GpusAreDescribed) {
  DeviceInventory inventory = DiscoverDevices();
  if (inventory.gpus.empty()) GTEST_SKIP() << inventory.gpu_unavailable_reason;
  for (size_t i = 0; i < inventory.gpus.size(); ++i) {
    const GpuInfo& gpu = inventory.gpus[i];
    EXPECT_EQ(gpu.index, static_cast<int>(i));
    EXPECT_FALSE(gpu.name.empty());
    EXPECT_GT(gpu.total_memory_bytes, 0);
    EXPECT_EQ(gpu.uuid.rfind("GPU-", 0), 0u);
  }
}

}  // namespace
}  // namespace gradhub::devices
