#include "services/common/contract/job_spec.h"

#include <gtest/gtest.h>

#include "services/common/contract/user_error.h"
#include "tests/support/job_specs.h"

namespace gradhub {
namespace {

bool HasIssue(const std::vector<SpecIssue>& issues, const std::string& field) {
  for (const auto& issue : issues) {
    if (issue.field == field) return true;
  }
  return false;
}

TEST(JobSpecTest, ParsesTheArchitectureExample) {
  v1::JobSpec spec = ParseJobSpec(testing::kArchitectureExampleYaml);
  EXPECT_EQ(spec.display_name(), "digits-mlp");
  EXPECT_EQ(spec.labels().at("team"), "vision");
  ASSERT_EQ(spec.model().mlp().layers_size(), 4);
  EXPECT_EQ(spec.model().mlp().layers(1), 256);
  EXPECT_EQ(spec.model().mlp().activation(), v1::MlpModel::RELU);
  EXPECT_FLOAT_EQ(spec.model().mlp().dropout(), 0.1f);
  EXPECT_EQ(spec.dataset().csv().label_column_index(), -1);
  EXPECT_EQ(spec.dataset().csv().normalize(), v1::CsvDataset::STANDARD);
  EXPECT_DOUBLE_EQ(spec.optimizer().sgd().momentum(), 0.9);
  EXPECT_EQ(spec.lr_schedule().step().step_size(), 200);
  EXPECT_EQ(spec.distributed().world_size(), 2);
  EXPECT_EQ(spec.seed(), 42u);
  EXPECT_TRUE(ValidateJobSpec(spec).empty());
}

TEST(JobSpecTest, JsonIsAcceptedToo) {
  v1::JobSpec spec = ParseJobSpec(R"({"displayName": "x", "seed": "7", "maxSteps": 3})");
  EXPECT_EQ(spec.display_name(), "x");
  EXPECT_EQ(spec.seed(), 7u);
}

TEST(JobSpecTest, QuotedNumbersStayStrings) {
  v1::JobSpec spec = ParseJobSpec("displayName: \"123\"\n");
  EXPECT_EQ(spec.display_name(), "123");
}

TEST(JobSpecTest, UnknownFieldsAndValuesAreNamed) {
  try {
    ParseJobSpec("modle: {}\n");
    FAIL() << "accepted an unknown field";
  } catch (const UserError& error) {
    EXPECT_NE(std::string(error.what()).find("modle"), std::string::npos) << error.what();
  }
  try {
    ParseJobSpec("distributed: {backend: MPI}\n");
    FAIL() << "accepted an unknown enum value";
  } catch (const UserError& error) {
    EXPECT_NE(std::string(error.what()).find("MPI"), std::string::npos) << error.what();
  }
  EXPECT_THROW(ParseJobSpec("a: [unclosed\n"), UserError);
}

TEST(JobSpecTest, EveryBadFieldIsReported) {
  v1::JobSpec spec = ParseJobSpec(R"(
model: {transformer: {contextLength: 0, dModel: 30, layers: 2, heads: 4}}
dataset: {csv: {path: ""}, validationFraction: 1.5}
optimizer: {sgd: {lr: -0.1}}
batchSizePerRank: 0
distributed: {worldSize: 5000, bucketCapMb: 4096}
)");
  auto issues = ValidateJobSpec(spec);
  for (const char* field :
       {"model.transformer.contextLength", "model.transformer.heads", "dataset.csv.path",
        "dataset.validationFraction", "optimizer.sgd.lr", "batchSizePerRank", "maxSteps",
        "distributed.worldSize", "distributed.bucketCapMb"}) {
    EXPECT_TRUE(HasIssue(issues, field)) << field;
  }
  EXPECT_THROW(CheckJobSpec(spec), UserError);
  EXPECT_TRUE(HasIssue(ValidateJobSpec(v1::JobSpec()), "model"));
  EXPECT_TRUE(HasIssue(ValidateJobSpec(v1::JobSpec()), "optimizer"));
}

TEST(JobSpecTest, DefaultsFillOnlyZeros) {
  v1::JobSpec spec = ParseJobSpec("distributed: {worldSize: 4}\nlogEverySteps: 5\n");
  v1::JobSpec filled = WithDefaults(spec);
  EXPECT_EQ(filled.distributed().world_size(), 4);
  EXPECT_EQ(filled.log_every_steps(), 5);
  EXPECT_EQ(filled.distributed().bucket_cap_mb(), 25);
  EXPECT_EQ(filled.grad_accumulation_steps(), 1);
  EXPECT_EQ(filled.checkpoint().keep_last(), 3);
  EXPECT_EQ(WithDefaults(v1::JobSpec()).distributed().world_size(), 1);
}

TEST(JobSpecTest, EfficiencySettingsAreValidatedByName) {
  v1::JobSpec spec = ParseJobSpec(R"(
distributed:
  commHook: FP16
  powerSgd: {matrixApproximationRank: -1, startStep: -3, minCompressionRate: 0.5}
  localSgd: {period: 0, warmupSteps: -1}
  shardOptimizerState: true
)");
  auto issues = ValidateJobSpec(spec);
  for (const char* field :
       {"distributed.powerSgd", "distributed.powerSgd.matrixApproximationRank",
        "distributed.powerSgd.startStep", "distributed.powerSgd.minCompressionRate",
        "distributed.localSgd.period", "distributed.localSgd.warmupSteps",
        "distributed.localSgd"}) {
    EXPECT_TRUE(HasIssue(issues, field)) << field;
  }
  // Each combination the engine does not support is its own issue.
  int local_sgd = 0;
  for (const auto& issue : issues) local_sgd += issue.field == "distributed.localSgd";
  EXPECT_EQ(local_sgd, 2);
  v1::JobSpec fine = ParseJobSpec(R"(
distributed: {commHook: POWER_SGD, powerSgd: {matrixApproximationRank: 4}, shardOptimizerState: true}
precision: BF16
)");
  for (const auto& issue : ValidateJobSpec(fine)) {
    EXPECT_NE(issue.field.rfind("distributed", 0), 0u) << issue.field << ": " << issue.message;
  }
}

// The issue of `field`, or fails the test.
SpecIssue IssueOf(const std::vector<SpecIssue>& issues, const std::string& field) {
  for (const auto& issue : issues) {
    if (issue.field == field) return issue;
  }
  ADD_FAILURE() << "no issue names " << field;
  return {};
}

TEST(JobSpecTest, Fp16RefusesWhatItsLossScalerCannotKeepInStep) {
  const auto local_sgd = ValidateJobSpec(
      ParseJobSpec("precision: FP16\ndistributed: {backend: NCCL, localSgd: {period: 4}}\n"));
  EXPECT_NE(IssueOf(local_sgd, "distributed.localSgd").message.find("precision FP16"),
            std::string::npos);
  const auto powersgd = ValidateJobSpec(
      ParseJobSpec("precision: FP16\ndistributed: {backend: NCCL, commHook: POWER_SGD}\n"));
  EXPECT_NE(IssueOf(powersgd, "distributed.commHook").message.find("POWER_SGD"), std::string::npos);
  const auto gloo =
      ValidateJobSpec(ParseJobSpec("precision: FP16\ndistributed: {backend: GLOO}\n"));
  const SpecIssue on_cpu = IssueOf(gloo, "precision");
  EXPECT_NE(on_cpu.message.find("backend GLOO trains on the CPU"), std::string::npos)
      << on_cpu.message;
  EXPECT_NE(on_cpu.message.find("BF16"), std::string::npos) << on_cpu.message;
  // What FP16 does support: NCCL or AUTO, ZeRO, compression hooks.
  for (const char* fine :
       {"precision: FP16\ndistributed: {backend: AUTO, shardOptimizerState: true}\n",
        "precision: FP16\ndistributed: {backend: NCCL, commHook: BF16}\n",
        "precision: BF16\ndistributed: {backend: GLOO, localSgd: {period: 2}}\n"}) {
    for (const auto& issue : ValidateJobSpec(ParseJobSpec(fine))) {
      EXPECT_TRUE(issue.field != "precision" && issue.field.rfind("distributed", 0) != 0)
          << fine << issue.field << ": " << issue.message;
    }
  }
}

TEST(JobSpecTest, NeedsCudaForNcclOrFp16AndTrainsOnCpuUnderGloo) {
  EXPECT_TRUE(NeedsCuda(ParseJobSpec("distributed: {backend: NCCL}\n")));
  EXPECT_TRUE(NeedsCuda(ParseJobSpec("precision: FP16\n")));  // backend AUTO
  EXPECT_FALSE(NeedsCuda(ParseJobSpec("precision: BF16\n")));
  EXPECT_FALSE(NeedsCuda(ParseJobSpec("distributed: {backend: GLOO}\n")));
  EXPECT_TRUE(TrainsOnCpu(ParseJobSpec("distributed: {backend: GLOO}\n")));
  EXPECT_FALSE(TrainsOnCpu(ParseJobSpec("distributed: {backend: AUTO}\n")));
  EXPECT_FALSE(TrainsOnCpu(ParseJobSpec("distributed: {backend: NCCL}\n")));
}

// The UserError CheckRankDevice throws, or "" when it accepts.
std::string RankDeviceRefusal(const std::string& yaml, RankDevice device,
                              const RankDeviceRules& rules = {}) {
  try {
    CheckRankDevice(ParseJobSpec(yaml), device, rules);
    return "";
  } catch (const UserError& error) {
    return error.what();
  }
}

TEST(JobSpecTest, CheckRankDeviceRefusesCudaSettingsOnTheCpuNamingTheField) {
  const std::string nccl = "distributed: {backend: NCCL}\n";
  EXPECT_EQ(RankDeviceRefusal(nccl, RankDevice::kCuda), "");
  EXPECT_EQ(RankDeviceRefusal(nccl, RankDevice::kCpu)
                .rfind("distributed.backend: NCCL needs a GPU node", 0),
            0u)
      << RankDeviceRefusal(nccl, RankDevice::kCpu);
  const std::string fp16 = "precision: FP16\n";
  EXPECT_EQ(RankDeviceRefusal(fp16, RankDevice::kCuda), "");
  EXPECT_EQ(RankDeviceRefusal(fp16, RankDevice::kCpu).rfind("precision: FP16", 0), 0u);
  // Gloo trains on the CPU even on a GPU node.
  EXPECT_EQ(RankDeviceRefusal("precision: FP16\ndistributed: {backend: GLOO}\n", RankDevice::kCuda)
                .rfind("precision: ", 0),
            0u);
  for (const char* anywhere : {"precision: BF16\n", "distributed: {backend: GLOO}\n", "{}\n"}) {
    EXPECT_EQ(RankDeviceRefusal(anywhere, RankDevice::kCpu), "") << anywhere;
    EXPECT_EQ(RankDeviceRefusal(anywhere, RankDevice::kCuda), "") << anywhere;
  }
}

TEST(JobSpecTest, Fp16OnTheCpuIsAllowedOnlyToTestsAndNeverWithNccl) {
  const RankDeviceRules test_rules{.allow_fp16_on_cpu = true};
  EXPECT_EQ(RankDeviceRefusal("precision: FP16\n", RankDevice::kCpu, test_rules), "");
  EXPECT_EQ(RankDeviceRefusal("precision: FP16\ndistributed: {backend: NCCL}\n", RankDevice::kCpu,
                              test_rules)
                .rfind("distributed.backend: ", 0),
            0u);
}

TEST(JobSpecTest, PowerSgdDefaults) {
  v1::JobSpec filled = WithDefaults(ParseJobSpec("distributed: {commHook: POWER_SGD}\n"));
  const auto& p = filled.distributed().power_sgd();
  EXPECT_EQ(p.matrix_approximation_rank(), 1);
  EXPECT_EQ(p.start_step(), 10);
  EXPECT_EQ(p.min_compression_rate(), 2);
  EXPECT_TRUE(p.error_feedback());
  EXPECT_TRUE(p.warm_start());
  v1::JobSpec zero_start = WithDefaults(ParseJobSpec(
      "distributed: {commHook: POWER_SGD, powerSgd: {startStep: 0, warmStart: false}}\n"));
  EXPECT_EQ(zero_start.distributed().power_sgd().start_step(), 0);
  EXPECT_FALSE(zero_start.distributed().power_sgd().warm_start());
  EXPECT_FALSE(WithDefaults(v1::JobSpec()).distributed().has_power_sgd());
}

}  // namespace
}  // namespace gradhub
