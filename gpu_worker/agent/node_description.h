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

// The devices seam. Today every node registers as a CPU node with `config.slots` slots.
// GPU discovery goes here: fill node->devices from the CUDA runtime (gpu_worker/devices'
// DiscoverDevices() already lists them), set kind CUDA and, unless --slots was given, one
// slot per device. Nothing else in the agent depends on how devices were found:
// RankAssignment.device_indices arrive from the server and become CUDA_VISIBLE_DEVICES.
void DescribeDevices(const AgentConfig& config, v1::Node* node);

// The whole RegisterNode description: name, kind, slots, devices, labels, address, version,
// and the data roots (config.isolation, as main set it up).
absl::StatusOr<v1::Node> DescribeNode(const AgentConfig& config);

}  // namespace gradhub::agent
