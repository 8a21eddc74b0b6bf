// PartitionLayers, one test per rule (stages.h), and the zoo's layer counts from the spec.
#include "gpu_worker/models/stages.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace gradhub::models {
namespace {

using ::testing::HasSubstr;

std::vector<StageRange> Ranges(std::vector<std::pair<int64_t, int64_t>> pairs) {
  std::vector<StageRange> ranges;
  for (const auto& [first, end] : pairs) ranges.push_back({first, end});
  return ranges;
}

std::string RefusalOf(const std::vector<double>& costs, int64_t stages) {
  try {
    PartitionLayers(costs, stages);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "no error";
}

// A range's cost summed as PartitionLayers sums it: from its first layer forward.
double CostOf(const std::vector<double>& costs, StageRange range) {
  double sum = 0;
  for (int64_t i = range.first_layer; i < range.end_layer; ++i) sum += costs[i];
  return sum;
}

double LargestStage(const std::vector<double>& costs, const std::vector<StageRange>& ranges) {
  double largest = 0;
  for (const StageRange& range : ranges) largest = std::max(largest, CostOf(costs, range));
  return largest;
}

// The smallest largest-stage cost over every split, by enumeration.
double BruteForceOptimum(const std::vector<double>& costs, int64_t stages) {
  const auto layers = static_cast<int64_t>(costs.size());
  double best = std::numeric_limits<double>::infinity();
  std::vector<StageRange> ranges;
  std::function<void(int64_t)> split = [&](int64_t first) {
    const auto placed = static_cast<int64_t>(ranges.size());
    if (placed == stages - 1) {
      ranges.push_back({first, layers});
      best = std::min(best, LargestStage(costs, ranges));
      ranges.pop_back();
      return;
    }
    for (int64_t end = first + 1; end <= layers - (stages - placed - 1); ++end) {
      ranges.push_back({first, end});
      split(end);
      ranges.pop_back();
    }
  };
  split(0);
  return best;
}

TEST(PartitionLayersTest, BalancedCostsSplitEvenly) {
  EXPECT_EQ(PartitionLayers(std::vector<double>(8, 1.0), 4),
            Ranges({{0, 2}, {2, 4}, {4, 6}, {6, 8}}));
  EXPECT_EQ(PartitionLayers({5, 5, 5, 5, 5, 5}, 2), Ranges({{0, 3}, {3, 6}}));
}

TEST(PartitionLayersTest, OneHeavyLayerGetsAStageOfItsOwn) {
  EXPECT_EQ(PartitionLayers({1, 1, 10, 1, 1}, 3), Ranges({{0, 2}, {2, 3}, {3, 5}}));
  // The heavy layer bounds every split; the rest still share the other stages.
  EXPECT_EQ(PartitionLayers({100, 1, 1, 1, 1}, 2), Ranges({{0, 1}, {1, 5}}));
}

TEST(PartitionLayersTest, MinimizesTheLargestStageNotTheCountOfLayers) {
  // [4 | 3 2 1] costs at most 6; [4 3 | 2 1], the even count, 7.
  EXPECT_EQ(PartitionLayers({4, 3, 2, 1}, 2), Ranges({{0, 1}, {1, 4}}));
}

TEST(PartitionLayersTest, MatchesTheOptimumOfEverySplit) {
  std::mt19937 random(33);
  std::uniform_real_distribution<double> cost(0.0, 10.0);
  for (int trial = 0; trial < 200; ++trial) {
    const int64_t layers = 1 + trial % 9;
    const int64_t stages = 1 + (trial / 9) % layers;
    std::vector<double> costs;
    for (int64_t i = 0; i < layers; ++i) costs.push_back(trial % 3 == 0 ? 1 + i % 2 : cost(random));
    const std::vector<StageRange> ranges = PartitionLayers(costs, stages);
    ASSERT_EQ(static_cast<int64_t>(ranges.size()), stages);
    EXPECT_EQ(ranges.front().first_layer, 0);
    EXPECT_EQ(ranges.back().end_layer, layers);
    for (size_t s = 0; s < ranges.size(); ++s) {
      EXPECT_GE(ranges[s].size(), 1) << "stage " << s << " of trial " << trial;
      if (s > 0) {
        EXPECT_EQ(ranges[s].first_layer, ranges[s - 1].end_layer);
      }
    }
    EXPECT_EQ(LargestStage(costs, ranges), BruteForceOptimum(costs, stages)) << "trial " << trial;
  }
}

TEST(PartitionLayersTest, StagesEqualToLayersGiveOneLayerEach) {
  EXPECT_EQ(PartitionLayers({3, 1, 2}, 3), Ranges({{0, 1}, {1, 2}, {2, 3}}));
  EXPECT_EQ(PartitionLayers({7}, 1), Ranges({{0, 1}}));
}

TEST(PartitionLayersTest, MoreStagesThanLayersAreRefusedNamingPipelineStages) {
  const std::string error = RefusalOf({1, 1, 1, 1}, 5);
  EXPECT_THAT(error, HasSubstr("pipelineStages 5"));
  EXPECT_THAT(error, HasSubstr("4 layers"));
  EXPECT_THAT(RefusalOf({1, 1}, 0), HasSubstr("pipelineStages 0"));
  EXPECT_THAT(RefusalOf({}, 1), HasSubstr("pipelineStages"));
}

TEST(PartitionLayersTest, TiesGoToTheEarlierStages) {
  EXPECT_EQ(PartitionLayers({1, 1, 1}, 2), Ranges({{0, 2}, {2, 3}}));
  EXPECT_EQ(PartitionLayers(std::vector<double>(10, 1.0), 4),
            Ranges({{0, 3}, {3, 6}, {6, 9}, {9, 10}}));
  // Free layers (no parameters) still leave every stage one layer.
  EXPECT_EQ(PartitionLayers({0, 0, 0, 0, 0}, 3), Ranges({{0, 3}, {3, 4}, {4, 5}}));
  // And the same costs give the same split every time.
  EXPECT_EQ(PartitionLayers({2, 1, 1, 2}, 2), PartitionLayers({2, 1, 1, 2}, 2));
}

TEST(PartitionLayersTest, NegativeOrNonFiniteCostsAreRefusedNamingTheLayer) {
  EXPECT_THAT(RefusalOf({1, -1, 1}, 2), HasSubstr("layer 1"));
  EXPECT_THAT(RefusalOf({1, 1, std::numeric_limits<double>::quiet_NaN()}, 2), HasSubstr("layer 2"));
  EXPECT_THAT(RefusalOf({std::numeric_limits<double>::infinity(), 1}, 2), HasSubstr("layer 0"));
  EXPECT_EQ(PartitionLayers({-0.0, 1}, 2), Ranges({{0, 1}, {1, 2}}));
}

TEST(ZooLayerCountTest, FollowsFromTheSpecAlone) {
  v1::ModelSpec mlp;
  for (int width : {64, 32, 16, 10}) mlp.mutable_mlp()->add_layers(width);
  EXPECT_EQ(ZooLayerCount(mlp), 3);

  v1::ModelSpec cnn;
  cnn.mutable_cnn();
  EXPECT_EQ(ZooLayerCount(cnn), 4);  // [6, 16] by default, then two Linear layers
  cnn.mutable_cnn()->add_channels(8);
  EXPECT_EQ(ZooLayerCount(cnn), 3);

  v1::ModelSpec resnet;
  resnet.mutable_resnet();
  EXPECT_EQ(ZooLayerCount(resnet), 11);  // stem, 3 x 3 blocks, head
  resnet.mutable_resnet()->add_blocks_per_stage(1);
  resnet.mutable_resnet()->add_blocks_per_stage(2);
  EXPECT_EQ(ZooLayerCount(resnet), 5);

  v1::ModelSpec transformer;
  transformer.mutable_transformer()->set_layers(6);
  EXPECT_EQ(ZooLayerCount(transformer), 8);  // embedding, 6 blocks, norm + head

  v1::ModelSpec script;
  script.mutable_torchscript()->set_path("/data/model.pt");
  EXPECT_EQ(ZooLayerCount(script), std::nullopt);
  EXPECT_EQ(ZooLayerCount(v1::ModelSpec()), std::nullopt);
}

}  // namespace
}  // namespace gradhub::models
