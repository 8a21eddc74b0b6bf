// Every refusal the trainer can make, and where CreateJob makes it first (issue 30: a job the
// trainer would refuse for its spec alone must be refused at submission, before it is queued,
// scheduled and started).
//
//   1. The scanner lists the trainer's refusals: each `UserError(<field>, ...)` in the sources
//      under gpu_worker/ (comments and string contents skipped), keyed by the field when it is
//      a string literal, else by "<file under gpu_worker/>: <the expression>".
//   2. kRefusals holds one entry per key: either a spec that ValidateJobSpec (what CreateJob
//      runs) refuses naming that field, or why the refusal cannot be known at submission.
//   3. A refusal found and not in the table fails the test, and so does an entry said to be
//      unknowable at submission that no longer matches a refusal: the table stays the list of
//      what the trainer refuses. (CheckRankDevice, in contract/, counts as the trainer's.)
#include <google/protobuf/descriptor.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "services/common/contract/job_spec.h"

namespace gradhub {
namespace {

namespace fs = std::filesystem;

// --- 1. the scanner ---

struct ThrowSite {
  std::string key;
  std::string where;  // file:line
};

// The end of the string or character literal that opens at `i` (the index past its quote).
size_t SkipQuoted(const std::string& text, size_t i) {
  const char quote = text[i];
  for (++i; i < text.size() && text[i] != quote; ++i) {
    if (text[i] == '\\') ++i;
  }
  return i + 1;
}

// The end of the raw string literal R"delim( ... )delim" that opens at `i` (at its R).
size_t SkipRawString(const std::string& text, size_t i) {
  const size_t open = text.find('(', i);
  const std::string close = ")" + text.substr(i + 2, open - i - 2) + "\"";
  const size_t end = text.find(close, open);
  return end == std::string::npos ? text.size() : end + close.size();
}

bool IsIdentifierChar(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

// Where code starts again after what opens at `i`, if a comment or literal opens there.
std::optional<size_t> SkipNonCode(const std::string& text, size_t i) {
  if (text.compare(i, 2, "//") == 0) return std::min(text.find('\n', i), text.size());
  if (text.compare(i, 2, "/*") == 0) return std::min(text.find("*/", i), text.size() - 2) + 2;
  if (text.compare(i, 2, "R\"") == 0 && (i == 0 || !IsIdentifierChar(text[i - 1]))) {
    return SkipRawString(text, i);
  }
  if (text[i] == '"') return SkipQuoted(text, i);
  // A quote after a digit is a digit separator (1'000), not a character literal.
  if (text[i] == '\'' && (i == 0 || !std::isdigit(static_cast<unsigned char>(text[i - 1])))) {
    return SkipQuoted(text, i);
  }
  return std::nullopt;
}

// The first argument of the call whose '(' is just before `i`, as written, whitespace folded.
std::string FirstArgument(const std::string& text, size_t i) {
  std::string argument;
  int depth = 0;
  while (i < text.size()) {
    if (const std::optional<size_t> end = SkipNonCode(text, i)) {
      if (text[i] != '/') argument += text.substr(i, *end - i);  // a literal, not a comment
      i = *end;
      continue;
    }
    const char c = text[i++];
    if (depth == 0 && (c == ',' || c == ')')) break;
    depth += (c == '(' || c == '[' || c == '{') - (c == ')' || c == ']' || c == '}');
    if (std::isspace(static_cast<unsigned char>(c))) {
      if (!argument.empty() && argument.back() != ' ') argument += ' ';
    } else {
      argument += c;
    }
  }
  while (!argument.empty() && argument.back() == ' ') argument.pop_back();
  return argument;
}

// The key of a refusal whose field argument is `argument`, in `file`.
std::string KeyOf(const std::string& argument, const std::string& file) {
  const bool literal = argument.size() >= 2 && argument.front() == '"' && argument.back() == '"' &&
                       SkipQuoted(argument, 0) == argument.size();
  return literal ? argument.substr(1, argument.size() - 2) : file + ": " + argument;
}

std::vector<ThrowSite> ScanFile(const std::string& text, const std::string& file) {
  static const std::string kCall = "UserError(";
  std::vector<ThrowSite> sites;
  for (size_t i = 0; i < text.size();) {
    if (const std::optional<size_t> end = SkipNonCode(text, i)) {
      i = *end;
      continue;
    }
    if (text.compare(i, kCall.size(), kCall) == 0 && (i == 0 || !IsIdentifierChar(text[i - 1]))) {
      const int line = 1 + static_cast<int>(std::count(text.begin(), text.begin() + i, '\n'));
      sites.push_back(
          {KeyOf(FirstArgument(text, i + kCall.size()), file), file + ":" + std::to_string(line)});
      i += kCall.size();
      continue;
    }
    ++i;
  }
  return sites;
}

// Every refusal in the .h and .cc files under `root`, keyed with paths relative to it.
std::vector<ThrowSite> ScanTree(const fs::path& root) {
  std::vector<ThrowSite> sites;
  for (const auto& entry : fs::recursive_directory_iterator(root)) {
    const std::string ext = entry.path().extension().string();
    if (!entry.is_regular_file() || (ext != ".cc" && ext != ".h")) continue;
    std::ifstream in(entry.path());
    std::stringstream text;
    text << in.rdbuf();
    const std::vector<ThrowSite> found =
        ScanFile(text.str(), fs::relative(entry.path(), root).string());
    sites.insert(sites.end(), found.begin(), found.end());
  }
  return sites;
}

TEST(SpecRulesScanner, FindsLiteralAndComputedFieldsAndSkipsCommentsAndStrings) {
  const std::string source = R"src(
// throw UserError("in.a.comment", "x");
/* UserError("in.a.block", "x") */
const char* s = "UserError(\"in.a.string\", \"x\")";
const char c = '"';
int n = 1'000;
throw UserError("model.mlp.layers",
                "needs " + std::to_string(2) + " entries");
throw UserError(
    field + ".numClasses", "x");
throw UserError("a[" + std::to_string(i) + "]", "x");
throw MyUserError("not.this", "x");
auto text = R"(UserError("in.a.raw.string", ""))";
)src";
  std::vector<std::string> keys;
  for (const ThrowSite& site : ScanFile(source, "f.cc")) keys.push_back(site.key);
  EXPECT_EQ(keys, (std::vector<std::string>{"model.mlp.layers", "f.cc: field + \".numClasses\"",
                                            "f.cc: \"a[\" + std::to_string(i) + \"]\""}));
  EXPECT_EQ(ScanFile(source, "f.cc")[0].where, "f.cc:7");
}

// --- 2. the table ---

enum class KnownAt {
  kSubmission,  // `text` is a spec (YAML, over kBase) that ValidateJobSpec refuses naming the key
  kDataFiles,   // depends on the contents of the files the spec names, read only by the trainer
  kPlacement,   // depends on the node a rank lands on: the scheduler places a spec only where
                // CheckRankDevice passes (scheduling_rules_test: DeviceKindsFor)
  kLaunch,      // depends on how the rank was started (its command line, its launch)
  kCheckpoint,  // depends on the checkpoint a rank resumes from
};

struct Refusal {
  const char* key;
  KnownAt known;
  const char* text;             // kSubmission: the spec; otherwise the reason, in words
  const char* field = nullptr;  // kSubmission: the field it names, when the key is not one
};

// A valid spec the examples change: each example's top-level fields replace kBase's.
constexpr char kBase[] = R"(
model: {mlp: {layers: [4, 8, 2]}}
dataset: {synthetic: {numSamples: 1000, numFeatures: 4, numClasses: 2}}
optimizer: {sgd: {lr: 0.1}}
batchSizePerRank: 10
maxSteps: 50
)";

const Refusal kRefusals[] = {
    // --- the spec alone: CreateJob refuses it first ---
    {"model", KnownAt::kSubmission, "dataset: {text: {path: /data/t.txt}}"},
    {"model.transformer", KnownAt::kSubmission,
     "model: {transformer: {contextLength: 8, dModel: 8, layers: 1, heads: 2}}"},
    {"model.transformer.heads", KnownAt::kSubmission,
     "model: {transformer: {contextLength: 8, dModel: 8, layers: 1, heads: 3}}\n"
     "dataset: {text: {path: /data/t.txt}}"},
    {"model.mlp.layers", KnownAt::kSubmission, "model: {mlp: {layers: [4]}}"},
    {"model.mlp.layers[0]", KnownAt::kSubmission,
     // With a file dataset the width is known only once it is read (kDataFiles).
     "model: {mlp: {layers: [3, 2]}}"},
    {"models/mlp.cc: \"model.mlp.layers[\" + std::to_string(widths.size() - 1) + \"]\"",
     KnownAt::kSubmission, "model: {mlp: {layers: [4, 3]}}", "model.mlp.layers[1]"},
    {"dataset", KnownAt::kSubmission, "dataset: {validationFraction: 0.1}"},
    {"batchSizePerRank", KnownAt::kSubmission,
     // With a file dataset the count of examples is known only once it is read.
     "batchSizePerRank: 600\ndistributed: {worldSize: 2}"},
    {"precision", KnownAt::kSubmission, "precision: FP16\ndistributed: {backend: GLOO}"},
    {"distributed.localSgd", KnownAt::kSubmission,
     "precision: FP16\ndistributed: {backend: NCCL, localSgd: {period: 2}}"},
    {"distributed.commHook", KnownAt::kSubmission,
     "precision: FP16\ndistributed: {backend: NCCL, commHook: POWER_SGD}"},
    // Pipeline parallelism (job_spec.cc CheckParallelismFields, CheckPipelineShape,
    // CheckPipelineCombinations; one example per field, job_spec_test has one per rule).
    // pipelineStages against the layers is known here for the zoo's models; a TorchScript
    // model's layers (its top-level children) only once the trainer loads the file.
    {"parallelism.pipelineStages", KnownAt::kSubmission,
     "distributed: {worldSize: 3}\nparallelism: {pipelineStages: 2}"},
    {"parallelism.microBatches", KnownAt::kSubmission,
     "distributed: {worldSize: 2}\nparallelism: {pipelineStages: 2, microBatches: 3}"},
    // The trainer's: INTERLEAVED_ONE_F_ONE_B on NCCL. Refused here with backend NCCL; with AUTO
    // the scheduler places it on CPU nodes only (DeviceKindsFor), where AUTO is Gloo.
    {"parallelism.schedule", KnownAt::kSubmission,
     "distributed: {worldSize: 2, backend: NCCL}\n"
     "parallelism: {pipelineStages: 2, schedule: INTERLEAVED_ONE_F_ONE_B}"},
    {"parallelism.balance", KnownAt::kSubmission, "parallelism: {balance: MEASURED_TIME}"},
    {"parallelism.chunksPerStage", KnownAt::kSubmission,
     "distributed: {worldSize: 2}\nparallelism: {pipelineStages: 2, chunksPerStage: 2}"},
    {"distributed.shardOptimizerState", KnownAt::kSubmission,
     "distributed: {worldSize: 2, shardOptimizerState: true}\nparallelism: {pipelineStages: 2}"},
    // --- where the rank landed ---
    {"distributed.backend", KnownAt::kPlacement,
     "NCCL on a CPU node: DeviceKindsFor gives NCCL CUDA nodes only"},
    {"distributed.encryptTraffic", KnownAt::kPlacement,
     "AUTO that became NCCL on a CUDA node, which has no encrypted transport (backend NCCL "
     "with encryptTraffic is refused at CreateJob)"},
    // --- how the rank was started ---
    {"distributed.worldSize", KnownAt::kLaunch,
     "the spec's world size against the ranks launched; the scheduler launches the spec's"},
    {"--device", KnownAt::kLaunch, "a command-line flag the agent sets"},
    {"--backend", KnownAt::kLaunch, "a command-line flag the agent sets"},
    {"--store", KnownAt::kLaunch, "a command-line flag the agent sets"},
    {"--spec", KnownAt::kLaunch, "a command-line flag the agent sets"},
    {"--rank", KnownAt::kLaunch, "a command-line flag the agent sets"},
    // --- the checkpoint it resumes ---
    {"spec", KnownAt::kCheckpoint,
     "a checkpoint written under a spec that differs in fields that decide the result"},
    {"checkpoint", KnownAt::kCheckpoint,
     "a checkpoint's bytes gradhub could not have written (checkpoint_archive.h, "
     "checkpoint_pickle.h), or whose tensors do not fit the model: a tenant can upload any "
     "bytes, and only the resuming rank reads them"},
    // --- the data files' contents ---
    {"dataset.csv.path", KnownAt::kDataFiles, "the CSV file's rows"},
    {"dataset.csv.labelColumnIndex", KnownAt::kDataFiles, "the CSV file's columns"},
    {"dataset.csv.labelColumnName", KnownAt::kDataFiles, "the CSV file's header"},
    {"dataset.csv.task", KnownAt::kDataFiles, "the CSV file's labels"},
    {"dataset.idx", KnownAt::kDataFiles, "the IDX files' sample counts"},
    {"dataset.idx.imagesPath", KnownAt::kDataFiles, "the IDX images file's shape"},
    {"dataset.text.path", KnownAt::kDataFiles, "the text file's length"},
    {"model.transformer.vocabSize", KnownAt::kDataFiles, "the characters of the text file"},
    {"", KnownAt::kDataFiles, "a CSV row's fields (no field: the message names the file's line)"},
    {"data/idx.cc: field", KnownAt::kDataFiles, "an IDX file's header"},
    {"dataset.idx.labelsPath", KnownAt::kDataFiles, "the IDX labels file's shape"},
    {"data/dataset.cc: field", KnownAt::kDataFiles, "a data file's size on the node"},
    {"models/model.cc: field", KnownAt::kDataFiles,
     "the samples' shape against a CNN or ResNet (a file's, or a synthetic one's width)"},
    {"models/model.cc: field + \".numClasses\"", KnownAt::kDataFiles, "the dataset's labels"},
    {"models/torchscript.cc: kField", KnownAt::kDataFiles,
     "the TorchScript file: its format, its parameters, its outputs on the data"},
};

// `base` with every top-level field that `example` sets replaced by the example's.
v1::JobSpec Overlay(v1::JobSpec base, const v1::JobSpec& example) {
  std::vector<const google::protobuf::FieldDescriptor*> fields;
  example.GetReflection()->ListFields(example, &fields);
  for (const auto* field : fields) base.GetReflection()->ClearField(&base, field);
  base.MergeFrom(example);
  return base;
}

TEST(SpecRules, TheBaseSpecIsValid) {
  for (const SpecIssue& issue : ValidateJobSpec(ParseJobSpec(kBase))) {
    ADD_FAILURE() << issue.field << ": " << issue.message;
  }
}

TEST(SpecRules, CreateJobRefusesFirstWhatTheSpecAloneDecides) {
  const v1::JobSpec base = ParseJobSpec(kBase);
  for (const Refusal& refusal : kRefusals) {
    if (refusal.known != KnownAt::kSubmission) continue;
    const std::string field = refusal.field != nullptr ? refusal.field : refusal.key;
    bool named = false;
    std::string issues;
    for (const SpecIssue& issue : ValidateJobSpec(Overlay(base, ParseJobSpec(refusal.text)))) {
      named = named || issue.field == field;
      issues += "\n  " + issue.field + ": " + issue.message;
    }
    EXPECT_TRUE(named) << refusal.key << ": ValidateJobSpec does not name " << field << " for\n"
                       << refusal.text << "\nissues:" << issues;
  }
}

TEST(SpecRules, EveryRefusalCannotBeKnownAtSubmissionSaysWhy) {
  for (const Refusal& refusal : kRefusals) {
    if (refusal.known == KnownAt::kSubmission) continue;
    EXPECT_GT(std::string(refusal.text).size(), 10u) << refusal.key;
  }
}

// --- 3. the table against the trainer's sources ---

TEST(SpecRules, EveryRefusalOfTheTrainerIsInTheTable) {
  const char* source_dir = std::getenv("GRADHUB_SOURCE_DIR");
  ASSERT_NE(source_dir, nullptr) << "GRADHUB_SOURCE_DIR is set by ctest";
  const std::vector<ThrowSite> sites = ScanTree(fs::path(source_dir) / "gpu_worker");
  ASSERT_GT(sites.size(), 20u) << "the scanner found too few refusals to be working";
  std::map<std::string, const Refusal*> table;
  for (const Refusal& refusal : kRefusals) {
    EXPECT_TRUE(table.emplace(refusal.key, &refusal).second) << "twice: " << refusal.key;
  }
  std::set<std::string> found;
  // And what the trainer refuses through CheckRankDevice (contract/, not under gpu_worker/).
  const v1::JobSpec cuda_only = ParseJobSpec("precision: FP16\ndistributed: {backend: NCCL}\n");
  for (const SpecIssue& issue : CudaOnlySettings(cuda_only, "on the CPU")) {
    found.insert(issue.field);
  }
  for (const ThrowSite& site : sites) {
    found.insert(site.key);
    EXPECT_TRUE(table.count(site.key))
        << site.where << " refuses " << site.key
        << ", which kRefusals does not list: add a spec that ValidateJobSpec refuses naming the "
           "field (and the rule to contract/job_spec.cc), or why it cannot be known at submission";
  }
  // A rule of the spec alone stays in the table (its example is still checked) once the
  // trainer leaves it to CheckJobSpec; any other entry must still be a refusal.
  for (const auto& [key, refusal] : table) {
    if (refusal->known == KnownAt::kSubmission) continue;
    EXPECT_TRUE(found.count(key)) << "kRefusals lists " << key
                                  << ", which the trainer does not refuse any more";
  }
}

}  // namespace
}  // namespace gradhub
