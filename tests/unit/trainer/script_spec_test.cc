// ValidateScriptSpec (services/common/contract/script_spec.h): one test per rule.
#include "services/common/contract/script_spec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "services/common/contract/job_spec.h"

namespace gradhub {
namespace {

using ::testing::IsEmpty;

constexpr char kScript[] = R"(
displayName: ddp-script
script:
  code: sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef
  entrypoint: train.py
  args: [--epochs, "3"]
  env: {LR: "0.1"}
distributed: {worldSize: 4, ranksPerNode: 2, backend: GLOO, collectiveTimeoutSeconds: 30}
checkpoint: {keepLast: 2}
maxRestarts: {infrastructure: 3, job: 1}
hangTimeoutSeconds: 120
priority: 5
seed: 7
nodeSelector: {zone: a}
labels: {team: nlp}
)";

std::vector<std::string> Fields(const v1::JobSpec& spec) {
  std::vector<std::string> fields;
  for (const SpecIssue& issue : ValidateJobSpec(spec)) fields.push_back(issue.field);
  return fields;
}

TEST(ScriptSpec, AScriptJobWithEveryFieldItMaySetIsValid) {
  EXPECT_THAT(Fields(ParseJobSpec(kScript)), IsEmpty());
}

TEST(ScriptSpec, CodeMustBeTheDigestOfAnUpload) {
  for (const char* code : {"", "./src", "sha256:ABC", "sha256:0123"}) {
    v1::JobSpec spec = ParseJobSpec(kScript);
    spec.mutable_script()->set_code(code);
    EXPECT_EQ(Fields(spec), std::vector<std::string>{"script.code"}) << code;
  }
}

TEST(ScriptSpec, TheEntrypointIsARelativePathInsideTheCode) {
  for (const char* entrypoint :
       {"", "/usr/bin/python3", "../x.py", "a/../../x.py", "a//b.py", "./train.py"}) {
    v1::JobSpec spec = ParseJobSpec(kScript);
    spec.mutable_script()->set_entrypoint(entrypoint);
    EXPECT_EQ(Fields(spec), std::vector<std::string>{"script.entrypoint"}) << entrypoint;
  }
  v1::JobSpec nested = ParseJobSpec(kScript);
  nested.mutable_script()->set_entrypoint("src/main.py");
  EXPECT_THAT(Fields(nested), IsEmpty());
}

TEST(ScriptSpec, TheInterpreterIsAnAbsolutePath) {
  v1::JobSpec spec = ParseJobSpec(kScript);
  spec.mutable_script()->set_interpreter("python3");
  EXPECT_EQ(Fields(spec), std::vector<std::string>{"script.interpreter"});
  spec.mutable_script()->set_interpreter("/opt/venv/bin/python");
  EXPECT_THAT(Fields(spec), IsEmpty());
}

TEST(ScriptSpec, ArgumentsAreBounded) {
  v1::JobSpec spec = ParseJobSpec(kScript);
  spec.mutable_script()->add_args(std::string(5000, 'x'));
  EXPECT_EQ(Fields(spec), std::vector<std::string>{"script.args[2]"});
}

TEST(ScriptSpec, EnvMayNotOverrideWhatGradhubSets) {
  for (const char* name : {"RANK", "MASTER_PORT", "GRADHUB_JOB_TOKEN", "TORCHELASTIC_RUN_ID",
                           "PYTHONPATH", "CUDA_VISIBLE_DEVICES", "HOME"}) {
    v1::JobSpec spec = ParseJobSpec(kScript);
    (*spec.mutable_script()->mutable_env())[name] = "x";
    EXPECT_EQ(Fields(spec), std::vector<std::string>{std::string("script.env.") + name}) << name;
  }
  v1::JobSpec lower = ParseJobSpec(kScript);
  (*lower.mutable_script()->mutable_env())["lr"] = "x";
  EXPECT_EQ(Fields(lower), std::vector<std::string>{"script.env.lr"});
  v1::JobSpec nccl = ParseJobSpec(kScript);
  (*nccl.mutable_script()->mutable_env())["NCCL_DEBUG"] = "INFO";
  EXPECT_THAT(Fields(nccl), IsEmpty());
}

TEST(ScriptSpec, TheTrainersFieldsAreRefusedEachByName) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"model: {mlp: {layers: [2, 2]}}\n", "model"},
      {"dataset: {synthetic: {numSamples: 8}}\n", "dataset"},
      {"optimizer: {sgd: {lr: 0.1}}\n", "optimizer"},
      {"batchSizePerRank: 8\n", "batchSizePerRank"},
      {"maxSteps: 10\n", "maxSteps"},
      {"precision: BF16\n", "precision"},
      {"checkpoint: {everySteps: 5, keepLast: 2}\n", "checkpoint.everySteps"},
      {"distributed: {worldSize: 4, commHook: POWER_SGD}\n", "distributed.commHook"},
      {"distributed: {worldSize: 4, shardOptimizerState: true}\n",
       "distributed.shardOptimizerState"},
  };
  for (const auto& [yaml, field] : cases) {
    std::string text = kScript;
    // The case's line replaces the example's line of the same section, or is added.
    const std::string key = yaml.substr(0, yaml.find(':'));
    const size_t at = text.find("\n" + key + ":");
    if (at != std::string::npos) text.erase(at + 1, text.find('\n', at + 1) - at);
    text += yaml;
    EXPECT_EQ(Fields(ParseJobSpec(text)), std::vector<std::string>{field}) << yaml;
  }
}

TEST(ScriptSpec, DefaultsAreOnlyThoseOfEveryJobAndTheInterpreter) {
  v1::JobSpec spec = ParseJobSpec(kScript);
  spec.mutable_checkpoint()->clear_keep_last();
  const v1::JobSpec effective = WithDefaults(spec);
  EXPECT_EQ(effective.script().interpreter(), kDefaultScriptInterpreter);
  EXPECT_EQ(effective.checkpoint().keep_last(), 3);
  EXPECT_EQ(effective.log_every_steps(), 0);  // the trainer's: left out
  EXPECT_THAT(Fields(effective), IsEmpty());  // a spec with defaults stays valid
}

}  // namespace
}  // namespace gradhub
