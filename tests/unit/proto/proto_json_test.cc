// Users write job specs as YAML/JSON through the proto3 JSON mapping, and the REST layer
// parses them with the same mapping. These tests pin down what that contract promises: the
// documented example parses into the fields we expect, typos are errors rather than silently
// ignored settings, and specs survive a round trip unchanged.

#include <string>
#include <vector>

#include <google/protobuf/util/json_util.h>
#include <google/protobuf/util/message_differencer.h>
#include <gtest/gtest.h>

#include "gradhub/v1/jobs.pb.h"

namespace gradhub::v1 {
namespace {

using google::protobuf::util::JsonStringToMessage;
using google::protobuf::util::MessageDifferencer;
using google::protobuf::util::MessageToJsonString;

// The job of docs/architecture.md ("A job spec"), as JSON.
constexpr char kDigitsMlpJson[] = R"json({
  "displayName": "digits-mlp",
  "labels": {"team": "vision"},
  "model": {"mlp": {"layers": [64, 256, 256, 10], "activation": "RELU", "dropout": 0.1}},
  "dataset": {
    "csv": {"path": "/data/digits.csv.gz", "labelColumnIndex": -1, "normalize": "STANDARD"},
    "validationFraction": 0.2
  },
  "optimizer": {"sgd": {"lr": 0.01, "momentum": 0.9, "weightDecay": 0.0001}},
  "lrSchedule": {"step": {"stepSize": 200, "gamma": 0.5}, "warmupSteps": 50},
  "batchSizePerRank": 64,
  "maxSteps": 1000,
  "evalEverySteps": 100,
  "distributed": {
    "worldSize": 2,
    "ranksPerNode": 1,
    "backend": "AUTO",
    "bucketCapMb": 25,
    "commHook": "NONE"
  },
  "checkpoint": {"everySteps": 200, "keepLast": 3},
  "maxRestarts": {"infrastructure": 5, "job": 1},
  "hangTimeoutSeconds": 60,
  "priority": 0,
  "seed": 42
})json";

JobSpec ParseOrDie(const std::string& json) {
  JobSpec spec;
  const auto status = JsonStringToMessage(json, &spec);
  EXPECT_TRUE(status.ok()) << status.ToString();
  return spec;
}

std::string ParseError(const std::string& json) {
  JobSpec spec;
  const auto status = JsonStringToMessage(json, &spec);
  EXPECT_FALSE(status.ok()) << "parsed: " << spec.ShortDebugString();
  return status.ToString();
}

TEST(ProtoJsonTest, ArchitectureExampleLandsInTheRightFields) {
  const JobSpec spec = ParseOrDie(kDigitsMlpJson);

  EXPECT_EQ(spec.display_name(), "digits-mlp");
  EXPECT_EQ(spec.labels().at("team"), "vision");

  ASSERT_TRUE(spec.model().has_mlp());
  const MlpModel& mlp = spec.model().mlp();
  EXPECT_EQ(std::vector<int>(mlp.layers().begin(), mlp.layers().end()),
            (std::vector<int>{64, 256, 256, 10}));
  EXPECT_EQ(mlp.activation(), MlpModel::RELU);
  EXPECT_FLOAT_EQ(mlp.dropout(), 0.1f);

  ASSERT_TRUE(spec.dataset().has_csv());
  const CsvDataset& csv = spec.dataset().csv();
  ASSERT_EQ(csv.label_case(), CsvDataset::kLabelColumnIndex);
  EXPECT_EQ(csv.label_column_index(), -1);
  EXPECT_EQ(csv.normalize(), CsvDataset::STANDARD);
  EXPECT_FLOAT_EQ(spec.dataset().validation_fraction(), 0.2f);

  ASSERT_TRUE(spec.optimizer().has_sgd());
  EXPECT_DOUBLE_EQ(spec.optimizer().sgd().lr(), 0.01);
  EXPECT_DOUBLE_EQ(spec.optimizer().sgd().momentum(), 0.9);
  EXPECT_DOUBLE_EQ(spec.optimizer().sgd().weight_decay(), 0.0001);

  ASSERT_TRUE(spec.lr_schedule().has_step());
  EXPECT_EQ(spec.lr_schedule().step().step_size(), 200);
  EXPECT_EQ(spec.lr_schedule().warmup_steps(), 50);

  EXPECT_EQ(spec.batch_size_per_rank(), 64);
  EXPECT_EQ(spec.max_steps(), 1000);
  EXPECT_EQ(spec.distributed().world_size(), 2);
  EXPECT_EQ(spec.distributed().backend(), DistributedSpec::AUTO);
  EXPECT_EQ(spec.distributed().comm_hook(), DistributedSpec::NONE);
  EXPECT_DOUBLE_EQ(spec.distributed().bucket_cap_mb(), 25.0);
  EXPECT_EQ(spec.checkpoint().every_steps(), 200);
  EXPECT_EQ(spec.checkpoint().keep_last(), 3);
  EXPECT_EQ(spec.max_restarts().infrastructure(), 5);
  EXPECT_EQ(spec.max_restarts().job(), 1);
  EXPECT_EQ(spec.hang_timeout_seconds(), 60);
  EXPECT_EQ(spec.seed(), 42u);
}

TEST(ProtoJsonTest, NonDefaultEnumNamesParse) {
  const JobSpec spec = ParseOrDie(R"({"distributed": {"backend": "NCCL", "commHook": "BF16"},
                                      "precision": "BF16"})");
  EXPECT_EQ(spec.distributed().backend(), DistributedSpec::NCCL);
  EXPECT_EQ(spec.distributed().comm_hook(), DistributedSpec::BF16);
  EXPECT_EQ(spec.precision(), JobSpec::BF16);
}

TEST(ProtoJsonTest, UnknownFieldIsRejectedByName) {
  EXPECT_NE(ParseError(R"({"distributed": {"wordSize": 2}})").find("wordSize"), std::string::npos);
}

TEST(ProtoJsonTest, UnknownEnumValueIsRejectedByName) {
  EXPECT_NE(ParseError(R"({"distributed": {"backend": "MPI"}})").find("MPI"), std::string::npos);
}

TEST(ProtoJsonTest, RoundTripIsLossless) {
  const JobSpec spec = ParseOrDie(kDigitsMlpJson);
  std::string json;
  ASSERT_TRUE(MessageToJsonString(spec, &json).ok());
  const JobSpec back = ParseOrDie(json);
  std::string diff;
  MessageDifferencer differencer;
  differencer.ReportDifferencesToString(&diff);
  EXPECT_TRUE(differencer.Compare(spec, back)) << diff << "\njson: " << json;
}

TEST(ProtoJsonTest, HostileDisplayNameSurvivesVerbatim) {
  const std::string hostile = R"(it's a "test"; '); DROP TABLE jobs; --)";
  JobSpec spec;
  spec.set_display_name(hostile);
  std::string json;
  ASSERT_TRUE(MessageToJsonString(spec, &json).ok());
  EXPECT_EQ(ParseOrDie(json).display_name(), hostile) << json;
}

}  // namespace
}  // namespace gradhub::v1
