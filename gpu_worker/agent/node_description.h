// What the agent tells RegisterNode about its node.
#pragma once

#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "gpu_worker/agent/config.h"
#include "gradhub/v1/nodes.pb.h"

namespace gradhub::agent {

inline constexpr char kAgentVersion[] = "gradhub-agent 0.1";

// "k=v,k=v" -> {k: v}. Empty text is no labels. INVALID_ARGUMENT naming --labels for an
// entry without '=' or with an empty key.
absl::StatusOr<std::map<std::string, std::string>> ParseLabels(const std::string& text);

// `nodes/<name>`; a name already written as `nodes/<name>` is kept.
std::string NodeResourceName(const std::string& name);

// --slots against the devices (config.devices): -1 = one per GPU on a CUDA node, 1 on a CPU
// node. INVALID_ARGUMENT naming --slots outside [1, 4096], or above the GPUs of a CUDA node:
// every rank there gets a GPU of its own (slot i is GPU i), so a slot more would be a rank
// without one. Fewer slots than GPUs leave the last GPUs unused.
absl::StatusOr<int64_t> EffectiveSlots(const AgentConfig& config);

// Kind, slots and devices from config.devices: a CUDA node lists every GPU (index, model,
// memory, compute capability, uuid, driver and CUDA versions); a CPU node none. Nothing else
// in the agent depends on how devices were found: RankAssignment.device_indices arrive from
// the server and become CUDA_VISIBLE_DEVICES (rank_launch.h).
absl::Status DescribeDevices(const AgentConfig& config, v1::Node* node);

// The whole RegisterNode description: name, kind, slots, devices, labels, address, version,
// and from config.isolation (as main set it up) the data roots, the tenant data roots and the
// memory cap of a slot (0 = none).
absl::StatusOr<v1::Node> DescribeNode(const AgentConfig& config);

}  // namespace gradhub::agent
