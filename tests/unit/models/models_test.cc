// The model zoo: output shapes per task, and spec/data mismatches reported as user errors
// that name the field and both shapes.
#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gpu_worker/models/model.h"
#include "services/common/contract/user_error.h"
#include "tests/unit/models/data_shapes.h"

namespace gradhub::models {
namespace {

using ::testing::HasSubstr;

std::string UserErrorOf(const v1::ModelSpec& spec, const DataShape& data) {
  try {
    BuildModel(spec, data);
  } catch (const UserError& e) {
    return e.what();
  }
  return "no error";
}

TEST(ModelsTest, MlpMapsFeaturesToLogits) {
  v1::ModelSpec spec;
  for (int width : {64, 32, 10}) spec.mutable_mlp()->add_layers(width);
  auto model = BuildModel(spec, Classification({64}, 10));
  EXPECT_EQ(model->Forward(at::randn({5, 64})).sizes(), (std::vector<int64_t>{5, 10}));
  EXPECT_THAT(model->Describe(), HasSubstr("mlp"));
}

TEST(ModelsTest, MlpWidthMismatchNamesBothShapes) {
  v1::ModelSpec spec;
  for (int width : {32, 10}) spec.mutable_mlp()->add_layers(width);
  const std::string error = UserErrorOf(spec, Classification({64}, 10));
  EXPECT_THAT(error, HasSubstr("model.mlp.layers"));
  EXPECT_THAT(error, HasSubstr("32"));
  EXPECT_THAT(error, HasSubstr("[64]"));

  v1::ModelSpec classes;
  for (int width : {64, 7}) classes.mutable_mlp()->add_layers(width);
  EXPECT_THAT(UserErrorOf(classes, Classification({64}, 10)), HasSubstr("10"));
}

TEST(ModelsTest, CnnAndResNetTakeImagesFromTheDataset) {
  v1::ModelSpec cnn;
  cnn.mutable_cnn();
  auto lenet = BuildModel(cnn, Classification({1, 28, 28}, 10));
  EXPECT_EQ(lenet->Forward(at::randn({2, 1, 28, 28})).sizes(), (std::vector<int64_t>{2, 10}));

  v1::ModelSpec resnet;
  resnet.mutable_resnet()->add_blocks_per_stage(1);
  resnet.mutable_resnet()->add_blocks_per_stage(1);
  auto net = BuildModel(resnet, Classification({3, 32, 32}, 4));
  EXPECT_EQ(net->Forward(at::randn({2, 3, 32, 32})).sizes(), (std::vector<int64_t>{2, 4}));
}

TEST(ModelsTest, TransformerPredictsEveryNextToken) {
  DataShape text;
  text.task = Task::kLanguageModel;
  text.sample_shape = {16};
  text.vocab_size = 50;
  v1::ModelSpec spec;
  auto* t = spec.mutable_transformer();
  t->set_context_length(16);
  t->set_d_model(32);
  t->set_layers(1);
  t->set_heads(4);
  auto model = BuildModel(spec, text);
  at::Tensor tokens = at::randint(50, {3, 16}, at::kLong);
  EXPECT_EQ(model->Forward(tokens).sizes(), (std::vector<int64_t>{3, 16, 50}));

  t->set_heads(5);
  EXPECT_THAT(UserErrorOf(spec, text), HasSubstr("model.transformer.heads"));
}

TEST(ModelsTest, TorchScriptErrorsNameThePath) {
  v1::ModelSpec spec;
  spec.mutable_torchscript()->set_path("/nonexistent/model.pt");
  EXPECT_THAT(UserErrorOf(spec, Classification({4}, 2)), HasSubstr("/nonexistent/model.pt"));

  const std::string not_script =
      (std::filesystem::temp_directory_path() / "gradhub-not-torchscript.pt").string();
  std::ofstream(not_script) << "plain text, not a TorchScript archive";
  spec.mutable_torchscript()->set_path(not_script);
  const std::string error = UserErrorOf(spec, Classification({4}, 2));
  EXPECT_THAT(error, HasSubstr("model.torchscript.path"));
  EXPECT_THAT(error, HasSubstr(not_script));
  std::filesystem::remove(not_script);
}

}  // namespace
}  // namespace gradhub::models
