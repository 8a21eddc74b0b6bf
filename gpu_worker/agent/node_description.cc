#include "gpu_worker/agent/node_description.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace gradhub::agent {

absl::StatusOr<std::map<std::string, std::string>> ParseLabels(const std::string& text) {
  std::map<std::string, std::string> labels;
  for (absl::string_view entry : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    entry = absl::StripAsciiWhitespace(entry);
    const size_t eq = entry.find('=');
    const absl::string_view key =
        absl::StripAsciiWhitespace(entry.substr(0, eq == absl::string_view::npos ? 0 : eq));
    if (eq == absl::string_view::npos || key.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("--labels: '", entry, "' is not key=value"));
    }
    labels[std::string(key)] = std::string(absl::StripAsciiWhitespace(entry.substr(eq + 1)));
  }
  return labels;
}

std::string NodeResourceName(const std::string& name) {
  return absl::StartsWith(name, "nodes/") ? name : "nodes/" + name;
}

absl::StatusOr<int64_t> EffectiveSlots(const AgentConfig& config) {
  const int64_t gpus = static_cast<int64_t>(config.devices.gpus.size());
  if (config.slots == -1) return config.devices.cuda ? gpus : 1;
  if (config.slots < 1 || config.slots > 4096) {
    return absl::InvalidArgumentError("--slots: must be in [1, 4096], or -1 for one per GPU");
  }
  if (config.devices.cuda && config.slots > gpus) {
    return absl::InvalidArgumentError(
        absl::StrCat("--slots: ", config.slots, " is more than this node's ", gpus,
                     " GPU(s); each rank gets a GPU of its own, so a GPU node runs at most one "
                     "rank per GPU (leave --slots at -1 for one per GPU)"));
  }
  return config.slots;
}

absl::Status DescribeDevices(const AgentConfig& config, v1::Node* node) {
  absl::StatusOr<int64_t> slots = EffectiveSlots(config);
  if (!slots.ok()) return slots.status();
  node->set_kind(config.devices.cuda ? v1::Node::CUDA : v1::Node::CPU);
  node->set_slots(static_cast<int32_t>(*slots));
  node->clear_devices();
  for (const v1::DeviceInfo& gpu : config.devices.gpus) *node->add_devices() = gpu;
  return absl::OkStatus();
}

absl::StatusOr<v1::Node> DescribeNode(const AgentConfig& config) {
  if (config.name.empty() || config.name == "nodes/") {
    return absl::InvalidArgumentError("--name: must not be empty");
  }
  auto labels = ParseLabels(config.labels);
  if (!labels.ok()) return labels.status();
  v1::Node node;
  node.set_name(NodeResourceName(config.name));
  if (absl::Status devices = DescribeDevices(config, &node); !devices.ok()) return devices;
  node.mutable_labels()->insert(labels->begin(), labels->end());
  node.set_address(config.address);
  node.set_master_port_base(static_cast<int32_t>(config.master_port_base));
  node.set_agent_version(kAgentVersion);
  for (const std::string& root : config.isolation.data_roots) node.add_data_roots(root);
  for (const TenantRoot& root : config.isolation.tenant_roots) {
    v1::TenantDataRoot* entry = node.add_tenant_data_roots();
    entry->set_tenant(root.tenant);
    entry->set_path(root.path);
  }
  node.set_memory_per_slot_bytes(config.isolation.memory_limit_bytes);
  return node;
}

}  // namespace gradhub::agent
