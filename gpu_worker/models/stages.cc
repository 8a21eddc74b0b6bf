#include "gpu_worker/models/stages.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

namespace gradhub::models {
namespace {

// Non-negative doubles order as their bit patterns do, so a binary search over the patterns
// finds the smallest double with a monotone property exactly.
uint64_t BitsOf(double value) {
  uint64_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}

double DoubleOf(uint64_t bits) {
  double value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

// The costs, checked; -0.0 made +0.0 so that every cost's bit pattern orders as its value.
std::vector<double> CheckedCosts(const std::vector<double>& costs, int64_t stages) {
  const int64_t layers = static_cast<int64_t>(costs.size());
  if (stages < 1) {
    throw std::invalid_argument("pipelineStages " + std::to_string(stages) + " must be at least 1");
  }
  if (stages > layers) {
    throw std::invalid_argument("pipelineStages " + std::to_string(stages) +
                                " exceeds the model's " + std::to_string(layers) + " layers");
  }
  std::vector<double> checked;
  checked.reserve(costs.size());
  for (size_t i = 0; i < costs.size(); ++i) {
    if (!std::isfinite(costs[i]) || costs[i] < 0) {
      throw std::invalid_argument("layer costs: layer " + std::to_string(i) + " costs " +
                                  std::to_string(costs[i]) + "; costs must be finite and >= 0");
    }
    checked.push_back(costs[i] + 0.0);
  }
  return checked;
}

// Step 2 of PartitionLayers: ranges of at most `bound` each, every stage as long as fits while
// leaving one layer per later stage; empty when the layers do not fit `stages` such ranges.
std::vector<StageRange> GreedyRanges(const std::vector<double>& costs, int64_t stages,
                                     double bound) {
  const int64_t layers = static_cast<int64_t>(costs.size());
  std::vector<StageRange> ranges;
  int64_t first = 0;
  for (int64_t stage = 0; stage < stages; ++stage) {
    const int64_t furthest = layers - (stages - stage - 1);
    int64_t end = first;
    double sum = 0;
    while (end < furthest && sum + costs[end] <= bound) sum += costs[end++];
    if (end == first) return {};  // one layer alone exceeds the bound
    ranges.push_back({first, end});
    first = end;
  }
  if (first != layers) return {};
  return ranges;
}

}  // namespace

std::optional<int64_t> ZooLayerCount(const v1::ModelSpec& spec) {
  switch (spec.kind_case()) {
    case v1::ModelSpec::kMlp:
      return std::max<int64_t>(spec.mlp().layers_size() - 1, 0);
    case v1::ModelSpec::kCnn:
      return static_cast<int64_t>(CnnChannels(spec.cnn()).size()) + 2;
    case v1::ModelSpec::kResnet: {
      int64_t blocks = 0;
      for (int64_t b : ResNetBlocks(spec.resnet())) blocks += std::max<int64_t>(b, 0);
      return blocks + 2;
    }
    case v1::ModelSpec::kTransformer:
      return std::max<int64_t>(spec.transformer().layers(), 0) + 2;
    case v1::ModelSpec::kTorchscript:
    case v1::ModelSpec::KIND_NOT_SET:
      break;
  }
  return std::nullopt;
}

std::vector<int64_t> CnnChannels(const v1::CnnModel& spec) {
  if (spec.channels().empty()) return {6, 16};
  return {spec.channels().begin(), spec.channels().end()};
}

std::vector<int64_t> ResNetBlocks(const v1::ResNetModel& spec) {
  if (spec.blocks_per_stage().empty()) return {3, 3, 3};
  return {spec.blocks_per_stage().begin(), spec.blocks_per_stage().end()};
}

std::vector<StageRange> PartitionLayers(const std::vector<double>& raw_costs, int64_t stages) {
  const std::vector<double> costs = CheckedCosts(raw_costs, stages);
  double total = 0;
  for (double cost : costs) total += cost;
  // Step 1: feasibility is monotone in the bound, and the optimum is itself a range's sum as
  // GreedyRanges adds it, so the smallest feasible double is the optimum, bit for bit.
  uint64_t low = 0, high = BitsOf(total);
  while (low < high) {
    const uint64_t middle = low + (high - low) / 2;
    if (GreedyRanges(costs, stages, DoubleOf(middle)).empty()) {
      low = middle + 1;
    } else {
      high = middle;
    }
  }
  return GreedyRanges(costs, stages, DoubleOf(low));
}

}  // namespace gradhub::models
