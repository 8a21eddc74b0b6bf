#include "services/common/contract/job_spec.h"

#include <google/protobuf/descriptor.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

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

// The values no spec can mean, wherever they sit, as gRPC delivers them (no JSON parser on the
// way): each one issue naming its path, and only that issue for its field.
TEST(JobSpecTest, ValuesTheProtoCannotMeanAreRefusedAnywhereByPath) {
  v1::JobSpec spec = testing::MinimalJobSpec();
  spec.set_precision(static_cast<v1::JobSpec::Precision>(7));
  spec.mutable_distributed()->set_backend(static_cast<v1::DistributedSpec::Backend>(-2));
  spec.mutable_optimizer()->mutable_sgd()->set_lr(std::numeric_limits<double>::quiet_NaN());
  spec.mutable_model()->mutable_mlp()->set_dropout(std::numeric_limits<float>::infinity());
  spec.mutable_lr_schedule()->mutable_cosine()->set_min_lr(-HUGE_VAL);
  spec.set_display_name(std::string("a\0b", 3));
  (*spec.mutable_labels())["team"] = "\xff";
  const auto issues = ValidateJobSpec(spec);
  EXPECT_NE(IssueOf(issues, "precision").message.find("7 is not a value of Precision"),
            std::string::npos);
  EXPECT_NE(IssueOf(issues, "distributed.backend").message.find("-2"), std::string::npos);
  EXPECT_NE(IssueOf(issues, "optimizer.sgd.lr").message.find("finite"), std::string::npos);
  EXPECT_NE(IssueOf(issues, "model.mlp.dropout").message.find("Infinity"), std::string::npos);
  EXPECT_NE(IssueOf(issues, "lrSchedule.cosine.minLr").message.find("-Infinity"),
            std::string::npos);
  EXPECT_NE(IssueOf(issues, "displayName").message.find("NUL"), std::string::npos);
  EXPECT_NE(IssueOf(issues, "labels.team").message.find("UTF-8"), std::string::npos);
  int lr_issues = 0;
  for (const auto& issue : issues) lr_issues += issue.field == "optimizer.sgd.lr";
  EXPECT_EQ(lr_issues, 1) << "a NaN rate is not also 'must be positive'";
}

TEST(JobSpecTest, JsonAndYamlSpecsGoThroughTheStrictParser) {
  for (const char* text :
       {R"({"precision": 7})", "optimizer: {sgd: {lr: NaN}}\n",
        "model: {mlp: {layers: [[64, 32], [10]]}}\n", "model: {mlp: {layers: [64, null, 10]}}\n",
        "displayName: a\ndisplayName: b\n", "model: {mlp: {layers: 64}}\n"}) {
    EXPECT_THROW(ParseJobSpec(text), UserError) << text;
  }
  try {
    ParseJobSpec("model: {mlp: {layers: [[64, 32], [10]]}}\n");
  } catch (const UserError& error) {
    EXPECT_NE(std::string(error.what()).find("model.mlp.layers[0]"), std::string::npos)
        << error.what();
  }
}

// YAML aliases make a graph: a spec that contains itself, or whose aliases multiply, is
// refused with a message instead of exhausting the stack or the memory (the job_spec fuzzer
// found the first as a stack overflow).
TEST(JobSpecTest, AliasesThatRecurseOrMultiplyAreRefused) {
  try {
    ParseJobSpec("model: {mlp: {layers: &x [*x, 0]}}\n");
    ADD_FAILURE() << "a spec that contains itself was accepted";
  } catch (const UserError& error) {
    EXPECT_NE(std::string(error.what()).find("deeper than 64 levels"), std::string::npos)
        << error.what();
  }
  std::string laughs = "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n";
  for (int i = 1; i <= 9; ++i) {  // 10^10 scalars once expanded
    const std::string prev = "*a" + std::to_string(i - 1);
    laughs += "a" + std::to_string(i) + ": &a" + std::to_string(i) + " [";
    for (int j = 0; j < 10; ++j) laughs += (j ? ", " : "") + prev;
    laughs += "]\n";
  }
  try {
    ParseJobSpec(laughs);
    ADD_FAILURE() << "a billion laughs was accepted";
  } catch (const UserError& error) {
    EXPECT_NE(std::string(error.what()).find("expands to more than 1 MiB"), std::string::npos)
        << error.what();
  }
  // An alias used as YAML intends, once, is fine.
  const v1::JobSpec spec =
      ParseJobSpec("model: {mlp: {layers: &widths [4, 8, 2]}}\nlabels: {a: &v x, b: *v}\n");
  EXPECT_EQ(spec.model().mlp().layers_size(), 3);
  EXPECT_EQ(spec.labels().at("b"), "x");
}

TEST(JobSpecTest, LengthLimitsCountCharactersNotBytes) {
  v1::JobSpec spec = testing::MinimalJobSpec();
  std::string name;
  for (int i = 0; i < 256; ++i) name += "\xc3\xa9";  // 256 characters, 512 bytes
  spec.set_display_name(name);
  (*spec.mutable_labels())["\xc3\xa9quipe"] = std::string(63, 'x');
  (*spec.mutable_labels())["ok"] = [] {
    std::string value;
    for (int i = 0; i < 63; ++i) value += "\xe2\x82\xac";  // 63 characters of 3 bytes
    return value;
  }();
  EXPECT_TRUE(ValidateJobSpec(spec).empty());
  spec.set_display_name(name + "x");
  const SpecIssue issue = IssueOf(ValidateJobSpec(spec), "displayName");
  EXPECT_NE(issue.message.find("is 257 characters long; at most 256"), std::string::npos)
      << issue.message;
  EXPECT_NE(issue.message.find("Unicode code points"), std::string::npos) << issue.message;
  (*spec.mutable_labels())["ok"] += "x";
  EXPECT_NE(IssueOf(ValidateJobSpec(spec), "labels.ok").message.find("code points"),
            std::string::npos);
}

TEST(JobSpecTest, MemoryPerRankIsBoundedAndNamed) {
  v1::JobSpec spec = testing::MinimalJobSpec();
  for (int64_t fine : {int64_t{0}, int64_t{512}, int64_t{16777216}}) {
    spec.set_memory_per_rank_mib(fine);
    EXPECT_TRUE(ValidateJobSpec(spec).empty()) << fine;
  }
  for (int64_t bad : {int64_t{-1}, int64_t{16777217}, std::numeric_limits<int64_t>::max()}) {
    spec.set_memory_per_rank_mib(bad);
    EXPECT_NE(IssueOf(ValidateJobSpec(spec), "memoryPerRankMib").message.find("16777216"),
              std::string::npos)
        << bad;
  }
  // A script job's ranks get the cap too.
  v1::JobSpec script = ParseJobSpec("script: {code: \"sha256:" + std::string(64, 'a') +
                                    "\", entrypoint: train.py}\n" + "memoryPerRankMib: 2048\n");
  EXPECT_TRUE(ValidateJobSpec(script).empty());
}

TEST(JobSpecTest, EncryptTrafficNeedsGlooOrAutoAndATrainerJob) {
  v1::JobSpec spec = testing::MinimalJobSpec();
  spec.mutable_distributed()->set_encrypt_traffic(true);
  for (auto backend : {v1::DistributedSpec::GLOO, v1::DistributedSpec::AUTO}) {
    spec.mutable_distributed()->set_backend(backend);
    EXPECT_TRUE(ValidateJobSpec(spec).empty()) << backend;
  }
  spec.mutable_distributed()->set_backend(v1::DistributedSpec::NCCL);
  EXPECT_NE(IssueOf(ValidateJobSpec(spec), "distributed.encryptTraffic").message.find("NCCL"),
            std::string::npos);
  v1::JobSpec script = ParseJobSpec("script: {code: \"sha256:" + std::string(64, 'a') +
                                    "\", entrypoint: train.py}\n" +
                                    "distributed: {encryptTraffic: true, backend: GLOO}\n");
  const auto issues = ValidateJobSpec(script);
  EXPECT_NE(IssueOf(issues, "distributed.encryptTraffic").message.find("its own transport"),
            std::string::npos);
  EXPECT_EQ(issues.size(), 1u);
}

TEST(JobSpecTest, CollectiveTimeoutIsBoundedAndBelowTheHangTimeout) {
  const std::string field = "distributed.collectiveTimeoutSeconds";
  v1::JobSpec spec = testing::MinimalJobSpec();
  spec.clear_hang_timeout_seconds();  // 0 = 600
  for (int32_t fine : {0, 1, 599}) {
    spec.mutable_distributed()->set_collective_timeout_seconds(fine);
    EXPECT_TRUE(ValidateJobSpec(spec).empty()) << fine;
  }
  for (int32_t bad : {-1, 86401, std::numeric_limits<int32_t>::max()}) {
    spec.mutable_distributed()->set_collective_timeout_seconds(bad);
    const auto issues = ValidateJobSpec(spec);
    EXPECT_NE(IssueOf(issues, field).message.find("86400"), std::string::npos) << bad;
    EXPECT_EQ(issues.size(), 1u) << bad;
  }
  // The watchdog would stop the attempt first, naming no unreachable node.
  spec.mutable_distributed()->set_collective_timeout_seconds(600);
  EXPECT_NE(IssueOf(ValidateJobSpec(spec), field).message.find("hangTimeoutSeconds (600)"),
            std::string::npos);
  spec.set_hang_timeout_seconds(30);
  spec.mutable_distributed()->set_collective_timeout_seconds(30);
  EXPECT_NE(IssueOf(ValidateJobSpec(spec), field).message.find("hangTimeoutSeconds (30)"),
            std::string::npos);
  spec.set_hang_timeout_seconds(86400 * 2);
  spec.mutable_distributed()->set_collective_timeout_seconds(86400);
  EXPECT_TRUE(ValidateJobSpec(spec).empty());
  // A script job's ranks get it too (as GRADHUB_COLLECTIVE_TIMEOUT).
  v1::JobSpec script =
      ParseJobSpec("script: {code: \"sha256:" + std::string(64, 'a') +
                   "\", entrypoint: train.py}\n" + "distributed: {collectiveTimeoutSeconds: 5}\n");
  EXPECT_TRUE(ValidateJobSpec(script).empty());
}

// --- parallelism (pipeline stages x data-parallel replicas) ---

// A valid pipelined job: an MLP of 4 layers (Linear), 2 stages x 2 replicas, a replica's batch
// of 8 in 4 micro-batches. `extra` is YAML whose top-level fields replace the base's.
v1::JobSpec PipelineSpec(const std::string& extra = "") {
  v1::JobSpec spec = ParseJobSpec(R"(
model: {mlp: {layers: [4, 8, 8, 8, 2]}}
dataset: {synthetic: {numSamples: 1000, numFeatures: 4, numClasses: 2}}
optimizer: {sgd: {lr: 0.1}}
batchSizePerRank: 8
maxSteps: 10
distributed: {worldSize: 4}
parallelism: {pipelineStages: 2, microBatches: 4}
)");
  if (!extra.empty()) {
    const v1::JobSpec changes = ParseJobSpec(extra);
    std::vector<const google::protobuf::FieldDescriptor*> fields;
    changes.GetReflection()->ListFields(changes, &fields);
    for (const auto* field : fields) spec.GetReflection()->ClearField(&spec, field);
    spec.MergeFrom(changes);
  }
  return spec;
}

std::string Issues(const std::vector<SpecIssue>& issues) {
  std::string text;
  for (const SpecIssue& issue : issues) text += "\n  " + issue.field + ": " + issue.message;
  return text;
}

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(JobSpecPipelineTest, WhatEachStagesDdpMakesCorrectIsAccepted) {
  for (const char* extra : {
           "",
           "parallelism: {pipelineStages: 2, schedule: GPIPE, balance: MEASURED_TIME}",
           "parallelism: {pipelineStages: 2, microBatches: 4, schedule: INTERLEAVED_ONE_F_ONE_B}",
           "parallelism: {pipelineStages: 2, microBatches: 2, schedule: INTERLEAVED_ONE_F_ONE_B, "
           "chunksPerStage: 2}",
           "parallelism: {pipelineStages: 4}\ndistributed: {worldSize: 4}",
           "distributed: {worldSize: 4, commHook: BF16, findUnusedParameters: true, "
           "encryptTraffic: true}",
           "distributed: {worldSize: 4, backend: NCCL, commHook: FP16}",
           "precision: BF16\ngradAccumulationSteps: 3\ngradClipNorm: 1.0",
       }) {
    const auto issues = ValidateJobSpec(PipelineSpec(extra));
    EXPECT_TRUE(issues.empty()) << extra << Issues(issues);
  }
}

TEST(JobSpecPipelineTest, NegativeCountsAreRefusedByName) {
  const auto issues = ValidateJobSpec(
      PipelineSpec("parallelism: {pipelineStages: -1, microBatches: -2, chunksPerStage: -3}"));
  for (const char* field :
       {"parallelism.pipelineStages", "parallelism.microBatches", "parallelism.chunksPerStage"}) {
    EXPECT_TRUE(Contains(IssueOf(issues, field).message, "must not be negative")) << field;
  }
}

// A setting of the pipeline without a pipeline would do nothing: refused, never ignored.
TEST(JobSpecPipelineTest, PipelineSettingsWithoutAPipelineAreRefusedNotIgnored) {
  for (const char* stages : {"", "pipelineStages: 1, "}) {
    const std::string prefix = std::string("parallelism: {") + stages;
    for (const auto& [setting, field] : std::vector<std::pair<std::string, std::string>>{
             {"microBatches: 4", "parallelism.microBatches"},
             {"schedule: GPIPE", "parallelism.schedule"},
             {"balance: MEASURED_TIME", "parallelism.balance"},
             {"chunksPerStage: 2", "parallelism.chunksPerStage"}}) {
      const std::string extra = prefix + setting + "}";
      const auto issues = ValidateJobSpec(PipelineSpec(extra));
      EXPECT_TRUE(Contains(IssueOf(issues, field).message, "would be ignored")) << extra;
      EXPECT_EQ(issues.size(), 1u) << extra << Issues(issues);
    }
  }
  EXPECT_TRUE(ValidateJobSpec(PipelineSpec("parallelism: {pipelineStages: 1}")).empty());
}

TEST(JobSpecPipelineTest, AScriptJobCannotBeSplitIntoStages) {
  const std::string script =
      "script: {code: \"sha256:" + std::string(64, 'a') + "\", entrypoint: train.py}\n";
  const auto issues = ValidateJobSpec(
      ParseJobSpec(script + "distributed: {worldSize: 2}\nparallelism: {pipelineStages: 2}\n"));
  EXPECT_TRUE(Contains(IssueOf(issues, "parallelism").message, "built-in trainer"));
  EXPECT_EQ(issues.size(), 1u) << Issues(issues);
}

// The message of the issue naming `field` in PipelineSpec(extra), or fails the test.
std::string PipelineIssue(const std::string& extra, const std::string& field) {
  const auto issues = ValidateJobSpec(PipelineSpec(extra));
  const std::string message = IssueOf(issues, field).message;
  if (message.empty()) ADD_FAILURE() << extra << Issues(issues);
  return message;
}

TEST(JobSpecPipelineTest, TheStagesDivideTheWorldSize) {
  EXPECT_TRUE(Contains(PipelineIssue("distributed: {worldSize: 3}", "parallelism.pipelineStages"),
                       "does not divide distributed.worldSize 3"));
  // worldSize 0 is 1 rank, which 2 stages do not fit.
  EXPECT_TRUE(
      Contains(PipelineIssue("distributed: {}", "parallelism.pipelineStages"), "worldSize 1"));
  EXPECT_TRUE(ValidateJobSpec(PipelineSpec("distributed: {worldSize: 6}")).empty());
}

TEST(JobSpecPipelineTest, MicroBatchesDivideAReplicasBatch) {
  EXPECT_TRUE(Contains(PipelineIssue("parallelism: {pipelineStages: 2, microBatches: 3}",
                                     "parallelism.microBatches"),
                       "3 does not divide batchSizePerRank 8"));
  // 0 means one micro-batch per stage: 3 stages do not divide 8 samples.
  EXPECT_TRUE(
      Contains(PipelineIssue("parallelism: {pipelineStages: 3}\ndistributed: {worldSize: 3}",
                             "parallelism.microBatches"),
               "0 means pipelineStages (3)"));
  EXPECT_TRUE(
      ValidateJobSpec(PipelineSpec("parallelism: {pipelineStages: 2, microBatches: 8}")).empty());
}

TEST(JobSpecPipelineTest, InterleavedNeedsRoundsOfStagesMicroBatchesAndTwoChunks) {
  EXPECT_TRUE(Contains(PipelineIssue("batchSizePerRank: 9\nparallelism: {pipelineStages: 2, "
                                     "microBatches: 3, schedule: INTERLEAVED_ONE_F_ONE_B}",
                                     "parallelism.microBatches"),
                       "3 is not a multiple of pipelineStages 2"));
  EXPECT_TRUE(Contains(PipelineIssue("parallelism: {pipelineStages: 2, schedule: "
                                     "INTERLEAVED_ONE_F_ONE_B, chunksPerStage: 1}",
                                     "parallelism.chunksPerStage"),
                       "ONE_F_ONE_B"));
}

TEST(JobSpecPipelineTest, InterleavedRunsOnGlooOnly) {
  const std::string interleaved =
      "parallelism: {pipelineStages: 2, schedule: INTERLEAVED_ONE_F_ONE_B}\n";
  EXPECT_TRUE(Contains(PipelineIssue(interleaved + "distributed: {worldSize: 4, backend: NCCL}",
                                     "parallelism.schedule"),
                       "Gloo only"));
  for (const char* backend : {"AUTO", "GLOO"}) {
    const v1::JobSpec spec =
        PipelineSpec(interleaved + "distributed: {worldSize: 4, backend: " + backend + "}");
    EXPECT_TRUE(ValidateJobSpec(spec).empty()) << backend;
    EXPECT_TRUE(RunsOnGlooOnly(spec)) << backend;
  }
  EXPECT_FALSE(RunsOnGlooOnly(PipelineSpec()));
}

TEST(JobSpecPipelineTest, ChunksPerStageOnlyWithTheInterleavedSchedule) {
  for (const std::string schedule : {"ONE_F_ONE_B", "GPIPE"}) {
    EXPECT_TRUE(Contains(PipelineIssue("parallelism: {pipelineStages: 2, chunksPerStage: 2, "
                                       "schedule: " +
                                           schedule + "}",
                                       "parallelism.chunksPerStage"),
                         "schedule " + schedule + " runs one chunk"));
  }
}

TEST(JobSpecPipelineTest, EveryStageAndChunkHoldsALayerOfAZooModel) {
  EXPECT_TRUE(Contains(PipelineIssue("parallelism: {pipelineStages: 8, microBatches: 8}\n"
                                     "distributed: {worldSize: 8}",
                                     "parallelism.pipelineStages"),
                       "8 exceeds the model's 4 layers (one per Linear)"));
  EXPECT_TRUE(Contains(PipelineIssue("parallelism: {pipelineStages: 2, schedule: "
                                     "INTERLEAVED_ONE_F_ONE_B, chunksPerStage: 3}",
                                     "parallelism.chunksPerStage"),
                       "2 stages x 3 chunks need 6 layers; the model has 4"));
  // A transformer of 1 block has 3 layers: embedding, block, norm with head.
  EXPECT_TRUE(Contains(
      PipelineIssue("model: {transformer: {contextLength: 8, dModel: 8, layers: 1, heads: 2}}\n"
                    "dataset: {text: {path: /data/t.txt}}\nparallelism: {pipelineStages: 4}",
                    "parallelism.pipelineStages"),
      "the model's 3 layers"));
  // A TorchScript model's layers are counted when a rank loads it.
  const auto scripted = ValidateJobSpec(PipelineSpec(
      "model: {torchscript: {path: /models/m.pt}}\ndataset: {csv: {path: /data/d.csv}}\n"
      "parallelism: {pipelineStages: 4}"));
  EXPECT_TRUE(scripted.empty()) << Issues(scripted);
}

// Each refusal names the setting and parallelism.pipelineStages.
TEST(JobSpecPipelineTest, WhatNeedsStateOrAgreementAcrossStagesIsRefusedNamingBoth) {
  for (const auto& [extra, field] : std::vector<std::pair<std::string, std::string>>{
           {"distributed: {worldSize: 4, shardOptimizerState: true}",
            "distributed.shardOptimizerState"},
           {"distributed: {worldSize: 4, localSgd: {period: 2}}", "distributed.localSgd"},
           {"distributed: {worldSize: 4, commHook: POWER_SGD}", "distributed.commHook"},
           {"precision: FP16\ndistributed: {worldSize: 4, backend: NCCL}", "precision"}}) {
    const auto issues = ValidateJobSpec(PipelineSpec(extra));
    EXPECT_TRUE(Contains(IssueOf(issues, field).message,
                         "cannot be combined with parallelism.pipelineStages 2"))
        << extra << Issues(issues);
    EXPECT_EQ(issues.size(), 1u) << extra << Issues(issues);
  }
}

TEST(JobSpecPipelineTest, AReplicasStagesShareItsSamples) {
  const v1::JobSpec spec = PipelineSpec("gradAccumulationSteps: 3");
  const Parallelism parallelism = ParallelismOf(spec);
  EXPECT_EQ(parallelism.stages, 2);
  EXPECT_EQ(parallelism.replicas, 2);
  EXPECT_EQ(parallelism.micro_batches, 4);
  EXPECT_EQ(parallelism.chunks_per_stage, 1);
  EXPECT_EQ(GlobalBatchSize(spec), 8 * 2 * 3);
  v1::JobSpec data_parallel = spec;
  data_parallel.clear_parallelism();
  EXPECT_FALSE(ParallelismOf(data_parallel).pipelined());
  EXPECT_EQ(ParallelismOf(data_parallel).replicas, 4);
  EXPECT_EQ(GlobalBatchSize(data_parallel), 8 * 4 * 3);
  // A synthetic dataset is split over the replicas, not the ranks: 1 replica of 4 stages
  // trains on all 100 samples, 4 ranks of data parallelism on 25 each.
  const std::string small =
      "dataset: {synthetic: {numSamples: 100, numFeatures: 4, "
      "numClasses: 2}}\nbatchSizePerRank: 60\n";
  EXPECT_TRUE(ValidateJobSpec(PipelineSpec(small + "parallelism: {pipelineStages: 4, "
                                                   "microBatches: 4}"))
                  .empty());
  EXPECT_TRUE(Contains(
      IssueOf(ValidateJobSpec(PipelineSpec(small + "parallelism: {}")), "batchSizePerRank").message,
      "over 4 ranks"));
}

TEST(JobSpecPipelineTest, DefaultsFillTheMicroBatchesAndChunksOfAPipelineOnly) {
  const v1::JobSpec interleaved = WithDefaults(
      PipelineSpec("parallelism: {pipelineStages: 2, schedule: INTERLEAVED_ONE_F_ONE_B}"));
  EXPECT_EQ(interleaved.parallelism().micro_batches(), 2);
  EXPECT_EQ(interleaved.parallelism().chunks_per_stage(), 2);
  EXPECT_EQ(WithDefaults(PipelineSpec("parallelism: {pipelineStages: 3}"))
                .parallelism()
                .chunks_per_stage(),
            0);
  // Without a pipeline the spec keeps its bytes (checkpoints compare them).
  const v1::JobSpec plain = testing::MinimalJobSpec();
  EXPECT_FALSE(WithDefaults(plain).has_parallelism());
}

}  // namespace
}  // namespace gradhub
