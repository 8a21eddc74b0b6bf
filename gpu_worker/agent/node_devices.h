// The agent's devices seam: which GPUs this node offers, found once at start (main) and kept
// in AgentConfig.devices. RegisterNode reports them (node_description.h); each rank gets the
// one of its slot (rank_launch.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gradhub/v1/nodes.pb.h"

namespace gradhub::devices {
struct DeviceInventory;
}

namespace gradhub::agent {

struct NodeDevices {
  // Registers as a CUDA node: GPUs were found (or faked).
  bool cuda = false;
  // DeviceInfo.index is the position here, which the server hands back as
  // RankAssignment.device_indices.
  std::vector<v1::DeviceInfo> gpus;
  // What a rank's CUDA_VISIBLE_DEVICES names gpus[i] by: the agent's own
  // CUDA_VISIBLE_DEVICES entry i when the agent was started with one (an operator who gives
  // the agent GPUs 2,3 gives its ranks only those), else i.
  std::vector<std::string> visible_ids;
  // One line for the agent's log: what was found, or why this is a CPU node.
  std::string summary;
};

// From what gpu_worker/devices found; `agent_visible_devices` is the agent's own
// CUDA_VISIBLE_DEVICES (null when unset).
NodeDevices FromInventory(const devices::DeviceInventory& inventory,
                          const char* agent_visible_devices);

// For tests only (--fake-gpus): `count` GPUs that are not there, so that registration,
// placement and the ranks' environment can be tested on a machine without any. The node
// registers as CUDA; a trainer started on it fails at start (no CUDA device), as it should.
NodeDevices FakeGpus(int count);

// FakeGpus(fake_gpus) when fake_gpus > 0, else the machine's (DiscoverDevices).
NodeDevices DiscoverNodeDevices(int64_t fake_gpus);

}  // namespace gradhub::agent
