// Pipeline stages of the zoo's models (model.h): for each architecture, the stages of a split
// compose to the whole model's forward and backward exactly, hold together exactly the whole
// model's parameters (names and values), and each holds only its own layers. Then TorchScript
// models split by their top-level children, and the refusal of one that is not a sequence.
#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/nn/module.h>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "gpu_worker/models/measure.h"
#include "gpu_worker/models/model.h"
#include "services/common/contract/user_error.h"
#include "tests/unit/models/data_shapes.h"

namespace gradhub::models {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr uint64_t kSeed = 20;

// One architecture, small, with the data it fits and a batch for it.
struct Architecture {
  std::string name;
  v1::ModelSpec spec;
  DataShape data;
  at::Tensor batch;
};

std::vector<Architecture> Architectures() {
  at::manual_seed(1);
  std::vector<Architecture> all;
  Architecture mlp{"mlp", {}, Classification({64}, 10), at::randn({3, 64})};
  for (int width : {64, 32, 16, 10}) mlp.spec.mutable_mlp()->add_layers(width);
  mlp.spec.mutable_mlp()->set_dropout(0.1f);
  all.push_back(mlp);

  Architecture cnn{"cnn", {}, Classification({64}, 10), at::randn({3, 64})};
  cnn.spec.mutable_cnn()->add_channels(4);
  cnn.spec.mutable_cnn()->add_channels(8);
  cnn.spec.mutable_cnn()->set_hidden(16);
  all.push_back(cnn);

  Architecture resnet{"resnet", {}, Classification({3, 8, 8}, 4), at::randn({3, 3, 8, 8})};
  resnet.spec.mutable_resnet()->add_blocks_per_stage(1);
  resnet.spec.mutable_resnet()->add_blocks_per_stage(2);
  resnet.spec.mutable_resnet()->set_base_width(4);
  all.push_back(resnet);

  DataShape text;
  text.task = Task::kLanguageModel;
  text.sample_shape = {8};
  text.vocab_size = 11;
  Architecture transformer{"transformer", {}, text, at::randint(11, {3, 8}, at::kLong)};
  auto* t = transformer.spec.mutable_transformer();
  t->set_context_length(8);
  t->set_d_model(16);
  t->set_layers(3);
  t->set_heads(2);
  t->set_dropout(0.1f);
  all.push_back(transformer);
  return all;
}

std::map<std::string, at::Tensor> TensorsOf(Model& model) {
  std::map<std::string, at::Tensor> tensors;
  for (const auto& item : model.module()->named_parameters()) tensors[item.key()] = item.value();
  for (const auto& item : model.module()->named_buffers()) tensors[item.key()] = item.value();
  return tensors;
}

int64_t ParameterCount(Model& model) {
  int64_t count = 0;
  for (const at::Tensor& p : model.module()->parameters()) count += p.numel();
  return count;
}

std::vector<std::unique_ptr<Model>> BuildStages(const Architecture& a,
                                                const std::vector<StageRange>& ranges) {
  std::vector<std::unique_ptr<Model>> stages;
  for (const StageRange& range : ranges) {
    stages.push_back(BuildModelStage(a.spec, a.data, range, kSeed));
    stages.back()->module()->eval();
  }
  return stages;
}

// The splits each test runs: every layer alone, two balanced stages, and three.
std::vector<std::vector<StageRange>> Splits(const Architecture& a) {
  const std::vector<double> counts = LayerParameterCounts(a.spec, a.data);
  std::vector<std::vector<StageRange>> splits;
  for (int64_t stages : {int64_t{2}, int64_t{3}, static_cast<int64_t>(counts.size())}) {
    splits.push_back(PartitionLayers(counts, stages));
  }
  return splits;
}

class ModelStagesTest : public ::testing::TestWithParam<Architecture> {};

TEST_P(ModelStagesTest, LayerCountIsTheZoosCountFromTheSpec) {
  const Architecture& a = GetParam();
  EXPECT_EQ(LayerCount(a.spec, a.data), ZooLayerCount(a.spec).value());
  EXPECT_EQ(static_cast<int64_t>(LayerParameterCounts(a.spec, a.data).size()),
            ZooLayerCount(a.spec).value());
}

TEST_P(ModelStagesTest, StagesComposeToTheWholeForwardExactly) {
  const Architecture& a = GetParam();
  auto whole = BuildModel(a.spec, a.data, kSeed);
  whole->module()->eval();
  const at::Tensor want = whole->Forward(a.batch);
  for (const auto& split : Splits(a)) {
    at::Tensor x = a.batch;
    for (auto& stage : BuildStages(a, split)) x = stage->Forward(x);
    EXPECT_TRUE(at::equal(x, want)) << a.name << ": " << split.size() << " stages";
  }
}

// The distributed backward's contract: each stage backpropagates the gradient of its output
// that the next stage computed for its input, and the parameters' gradients are the whole
// model's.
TEST_P(ModelStagesTest, StagesBackpropagateToTheWholeModelsGradients) {
  const Architecture& a = GetParam();
  auto whole = BuildModel(a.spec, a.data, kSeed);
  whole->module()->eval();
  whole->Forward(a.batch).square().sum().backward();
  const auto split = PartitionLayers(LayerParameterCounts(a.spec, a.data), 3);
  auto stages = BuildStages(a, split);
  std::vector<at::Tensor> inputs, outputs;
  at::Tensor x = a.batch;
  for (auto& stage : stages) {
    inputs.push_back(x.is_floating_point() ? x.detach().requires_grad_() : x);
    outputs.push_back(stage->Forward(inputs.back()));
    x = outputs.back();
  }
  outputs.back().square().sum().backward();
  for (size_t s = stages.size() - 1; s > 0; --s) outputs[s - 1].backward(inputs[s].grad());
  std::map<std::string, at::Tensor> want;
  for (const auto& item : whole->module()->named_parameters())
    want[item.key()] = item.value().grad();
  for (auto& stage : stages) {
    for (const auto& item : stage->module()->named_parameters()) {
      ASSERT_TRUE(item.value().grad().defined()) << item.key();
      EXPECT_TRUE(at::allclose(item.value().grad(), want.at(item.key()), 1e-5, 1e-7))
          << a.name << ": " << item.key();
    }
  }
}

TEST_P(ModelStagesTest, StagesTogetherHoldExactlyTheWholeModelsTensors) {
  const Architecture& a = GetParam();
  auto whole = BuildModel(a.spec, a.data, kSeed);
  const std::map<std::string, at::Tensor> want = TensorsOf(*whole);
  for (const auto& split : Splits(a)) {
    std::map<std::string, at::Tensor> got;
    for (auto& stage : BuildStages(a, split)) {
      for (const auto& [name, tensor] : TensorsOf(*stage)) {
        EXPECT_TRUE(got.emplace(name, tensor).second) << name << " in two stages";
      }
    }
    ASSERT_EQ(got.size(), want.size()) << a.name;
    for (const auto& [name, tensor] : want) {
      ASSERT_TRUE(got.count(name)) << a.name << ": no stage holds " << name;
      EXPECT_TRUE(at::equal(got[name], tensor)) << a.name << ": " << name << " differs";
    }
  }
}

TEST_P(ModelStagesTest, AStageHoldsOnlyItsOwnLayers) {
  const Architecture& a = GetParam();
  const std::vector<double> counts = LayerParameterCounts(a.spec, a.data);
  const int64_t layers = static_cast<int64_t>(counts.size());
  const StageRange middle{1, layers - 1};
  auto stage = BuildModelStage(a.spec, a.data, middle, kSeed);
  double want = 0;
  for (int64_t i = middle.first_layer; i < middle.end_layer; ++i) want += counts[i];
  EXPECT_EQ(ParameterCount(*stage), static_cast<int64_t>(want)) << a.name;
  EXPECT_LT(ParameterCount(*stage), ParameterCount(*BuildModel(a.spec, a.data, kSeed)));
  std::set<std::string> layer_names;
  for (const auto& [name, tensor] : TensorsOf(*stage)) {
    layer_names.insert(name.substr(0, name.find('.', name.find('.') + 1)));
  }
  std::set<std::string> expected;
  for (int64_t i = middle.first_layer; i < middle.end_layer; ++i) {
    if (counts[i] > 0) expected.insert("layers." + std::to_string(i));
  }
  EXPECT_EQ(layer_names, expected) << a.name;
  EXPECT_THAT(stage->Describe(), HasSubstr("layers [1, " + std::to_string(layers - 1) + ") of " +
                                           std::to_string(layers)));
}

TEST_P(ModelStagesTest, InitializationDependsOnTheSeedOnly) {
  const Architecture& a = GetParam();
  auto first = BuildModel(a.spec, a.data, 7);
  auto again = BuildModel(a.spec, a.data, 7);
  auto other = BuildModel(a.spec, a.data, 8);
  const auto want = TensorsOf(*first);
  for (const auto& [name, tensor] : TensorsOf(*again)) {
    EXPECT_TRUE(at::equal(tensor, want.at(name))) << name;
  }
  int64_t differ = 0;
  for (const auto& [name, tensor] : TensorsOf(*other)) differ += !at::equal(tensor, want.at(name));
  EXPECT_GT(differ, 0) << a.name << ": seed 8 built seed 7's weights";
}

// The trainer seeds torch with JobSpec.seed and calls BuildModel(spec, data): that is the
// model every split of the same seed starts from, and building leaves torch's generator as
// it found it (the data order and dropout draws after it do not depend on the model).
TEST_P(ModelStagesTest, BuildingWithTorchsSeedIsBuildingWithThatSeed) {
  const Architecture& a = GetParam();
  at::manual_seed(kSeed);
  const at::Tensor undisturbed = at::randn({4});
  at::manual_seed(kSeed);
  auto seeded = BuildModel(a.spec, a.data);
  EXPECT_TRUE(at::equal(at::randn({4}), undisturbed)) << a.name << " moved torch's generator";
  const auto want = TensorsOf(*BuildModel(a.spec, a.data, kSeed));
  for (const auto& [name, tensor] : TensorsOf(*seeded)) {
    EXPECT_TRUE(at::equal(tensor, want.at(name))) << name;
  }
}

TEST_P(ModelStagesTest, RangesOutsideTheModelAreRefused) {
  const Architecture& a = GetParam();
  const int64_t layers = LayerCount(a.spec, a.data);
  for (StageRange bad :
       {StageRange{0, 0}, StageRange{2, 1}, StageRange{-1, 1}, StageRange{0, layers + 1}}) {
    EXPECT_THROW(BuildModelStage(a.spec, a.data, bad, kSeed), std::invalid_argument)
        << bad.first_layer << ", " << bad.end_layer;
  }
}

TEST_P(ModelStagesTest, MeasuredSecondsCoverEveryLayer) {
  const Architecture& a = GetParam();
  const std::vector<double> seconds = MeasureLayerSeconds(a.spec, a.data, a.batch, kSeed, 1);
  ASSERT_EQ(static_cast<int64_t>(seconds.size()), LayerCount(a.spec, a.data));
  for (double s : seconds) EXPECT_GT(s, 0) << a.name;
  EXPECT_EQ(PartitionLayers(seconds, 2).size(), 2u);
  EXPECT_THROW(MeasureLayerSeconds(a.spec, a.data, a.batch, kSeed, 0), std::invalid_argument);
}

INSTANTIATE_TEST_SUITE_P(Zoo, ModelStagesTest, ::testing::ValuesIn(Architectures()),
                         [](const auto& info) { return info.param.name; });

// --- TorchScript: split by top-level children ---

class TorchScriptStagesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("gradhub-model-stages-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // A module scripted by Python's torch.jit.script; empty when Python's torch is missing.
  std::string Script(const std::string& name, const std::string& module) {
    const std::string path = (dir_ / (name + ".pt")).string();
    const std::string program = (dir_ / (name + ".py")).string();
    std::ofstream(program) << "import torch\n"
                           << "from torch import nn\n"
                           << module << "\n"
                           << "torch.manual_seed(0)\n"
                           << "torch.jit.script(Model()).save('" << path << "')\n";
    const std::string command = "/usr/bin/python3 " + program + " >/dev/null 2>&1";
    return std::system(command.c_str()) == 0 ? path : "";
  }

  static v1::ModelSpec Spec(const std::string& path) {
    v1::ModelSpec spec;
    spec.mutable_torchscript()->set_path(path);
    return spec;
  }

  std::filesystem::path dir_;
};

constexpr char kSequential[] = R"(
class Model(nn.Sequential):
    def __init__(self):
        super().__init__(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 3))
)";

constexpr char kResidual[] = R"(
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 8)
        self.b = nn.Linear(8, 8)
        self.c = nn.Linear(8, 3)

    def forward(self, x):
        h = self.a(x)
        return self.c(self.b(h) + h)
)";

TEST_F(TorchScriptStagesTest, SequentialModuleSplitsByItsChildren) {
  const std::string path = Script("sequential", kSequential);
  if (path.empty()) GTEST_SKIP() << "python3 with torch unavailable";
  const v1::ModelSpec spec = Spec(path);
  const DataShape data = Classification({4}, 3);
  ASSERT_EQ(LayerCount(spec, data), 5);
  EXPECT_EQ(LayerParameterCounts(spec, data), (std::vector<double>{40, 0, 72, 0, 27}));

  auto whole = BuildModel(spec, data, kSeed);
  whole->module()->eval();
  const at::Tensor batch = at::randn({6, 4});
  const at::Tensor want = whole->Forward(batch);
  const std::map<std::string, at::Tensor> want_tensors = TensorsOf(*whole);
  auto first = BuildModelStage(spec, data, {0, 2}, kSeed);
  auto second = BuildModelStage(spec, data, {2, 5}, kSeed);
  first->module()->eval();
  second->module()->eval();
  EXPECT_TRUE(at::allclose(second->Forward(first->Forward(batch)), want));
  EXPECT_EQ(ParameterCount(*first), 40);
  EXPECT_EQ(ParameterCount(*second), 99);
  std::map<std::string, at::Tensor> got = TensorsOf(*first);
  for (const auto& [name, tensor] : TensorsOf(*second)) got[name] = tensor;
  ASSERT_EQ(got.size(), want_tensors.size());
  for (const auto& [name, tensor] : want_tensors) {
    ASSERT_TRUE(got.count(name)) << name;
    EXPECT_TRUE(at::equal(got[name], tensor)) << name;
  }
  EXPECT_THAT(second->Describe(), HasSubstr("children [2, 5) of 5"));
}

TEST_F(TorchScriptStagesTest, ResidualAcrossChildrenIsRefusedWhenSplitOnly) {
  const std::string path = Script("residual", kResidual);
  if (path.empty()) GTEST_SKIP() << "python3 with torch unavailable";
  const v1::ModelSpec spec = Spec(path);
  const DataShape data = Classification({4}, 3);
  EXPECT_EQ(LayerCount(spec, data), 3);
  EXPECT_EQ(BuildModel(spec, data, kSeed)->Forward(at::randn({2, 4})).sizes(),
            (std::vector<int64_t>{2, 3}));
  EXPECT_NO_THROW(BuildModelStage(spec, data, {0, 3}, kSeed));
  try {
    BuildModelStage(spec, data, {0, 1}, kSeed);
    ADD_FAILURE() << "a residual across children was split";
  } catch (const UserError& e) {
    EXPECT_THAT(e.what(), HasSubstr("model.torchscript"));
    EXPECT_THAT(e.what(), HasSubstr("parallelism.pipelineStages"));
    EXPECT_THAT(e.what(), HasSubstr(path));
  }
  EXPECT_THROW(LayerParameterCounts(spec, data), UserError);
}

}  // namespace
}  // namespace gradhub::models
