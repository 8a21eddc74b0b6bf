#include "services/common/contract/job_spec.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <optional>
#include <regex>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "gpu_worker/models/stages.h"
#include "services/common/contract/defaults.h"
#include "services/common/contract/proto_json.h"
#include "services/common/contract/script_spec.h"
#include "services/common/contract/user_error.h"
#include "services/common/json_text.h"
#include "services/common/text_rules.h"

namespace gradhub {
namespace {

// YAML scalars are untyped; the proto3 JSON parser accepts numbers and booleans only
// unquoted, and every string quoted. Plain scalars that read as numbers or booleans go
// unquoted, everything else (and anything the user quoted) as a string.
bool LooksLikeJsonLiteral(const std::string& value) {
  static const std::regex kNumber(R"(-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?)");
  return value == "true" || value == "false" || std::regex_match(value, kNumber);
}

// Aliases make a YAML document a graph, not a tree: one that contains itself (`&x [*x]`)
// never ends, and aliases of aliases multiply (a "billion laughs" of a few hundred bytes).
// A spec is a few levels deep and a few KiB, so the conversion refuses to go deeper or grow
// larger than any spec needs, before it exhausts the stack or the memory.
constexpr int kMaxSpecDepth = 64;
constexpr size_t kMaxSpecJsonBytes = size_t{1} << 20;

void ToJson(const YAML::Node& node, int depth, std::string* out) {
  if (depth > kMaxSpecDepth) {
    throw UserError("", "spec nests deeper than " + std::to_string(kMaxSpecDepth) +
                            " levels (an alias that contains itself?)");
  }
  if (out->size() > kMaxSpecJsonBytes) {
    throw UserError("", "spec expands to more than " + std::to_string(kMaxSpecJsonBytes >> 20) +
                            " MiB (aliases of aliases?)");
  }
  switch (node.Type()) {
    case YAML::NodeType::Map: {
      *out += "{";
      bool first = true;
      for (const auto& item : node) {
        if (!first) *out += ",";
        first = false;
        *out += QuoteJson(item.first.Scalar()) + ":";
        ToJson(item.second, depth + 1, out);
      }
      *out += "}";
      return;
    }
    case YAML::NodeType::Sequence: {
      *out += "[";
      for (size_t i = 0; i < node.size(); ++i) {
        if (i) *out += ",";
        ToJson(node[i], depth + 1, out);
      }
      *out += "]";
      return;
    }
    case YAML::NodeType::Scalar:
      *out += node.Tag() == "!" || !LooksLikeJsonLiteral(node.Scalar()) ? QuoteJson(node.Scalar())
                                                                        : node.Scalar();
      return;
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined:
      *out += "null";
      return;
  }
}

// The issues found. A field whose value no spec can mean (ProtoValueIssues) gets that issue
// alone: a NaN learning rate is not also "must be positive".
class Checker {
 public:
  void Unmeant(SpecIssue issue) {
    unmeant_.push_back(issue.field);
    issues_.push_back(std::move(issue));
  }
  void Require(bool ok, std::string field, std::string message) {
    if (ok || std::find(unmeant_.begin(), unmeant_.end(), field) != unmeant_.end()) return;
    issues_.push_back({std::move(field), std::move(message)});
  }
  std::vector<SpecIssue> Take() { return std::move(issues_); }

 private:
  std::vector<SpecIssue> issues_;
  std::vector<std::string> unmeant_;
};

void CheckModel(const v1::ModelSpec& model, Checker& check) {
  switch (model.kind_case()) {
    case v1::ModelSpec::kMlp: {
      const auto& mlp = model.mlp();
      check.Require(mlp.layers_size() >= 2, "model.mlp.layers",
                    "needs at least 2 widths (input and output)");
      for (int i = 0; i < mlp.layers_size(); ++i) {
        check.Require(mlp.layers(i) > 0, "model.mlp.layers[" + std::to_string(i) + "]",
                      "must be positive");
      }
      check.Require(mlp.dropout() >= 0 && mlp.dropout() < 1, "model.mlp.dropout",
                    "must be in [0, 1)");
      return;
    }
    case v1::ModelSpec::kCnn:
      for (int i = 0; i < model.cnn().channels_size(); ++i) {
        check.Require(model.cnn().channels(i) > 0, "model.cnn.channels[" + std::to_string(i) + "]",
                      "must be positive");
      }
      check.Require(model.cnn().hidden() >= 0, "model.cnn.hidden", "must not be negative");
      return;
    case v1::ModelSpec::kResnet:
      for (int i = 0; i < model.resnet().blocks_per_stage_size(); ++i) {
        check.Require(model.resnet().blocks_per_stage(i) > 0,
                      "model.resnet.blocksPerStage[" + std::to_string(i) + "]", "must be positive");
      }
      check.Require(model.resnet().base_width() >= 0, "model.resnet.baseWidth",
                    "must not be negative");
      return;
    case v1::ModelSpec::kTransformer: {
      const auto& t = model.transformer();
      check.Require(t.context_length() > 0, "model.transformer.contextLength", "must be positive");
      check.Require(t.d_model() > 0, "model.transformer.dModel", "must be positive");
      check.Require(t.layers() > 0, "model.transformer.layers", "must be positive");
      check.Require(t.heads() > 0, "model.transformer.heads", "must be positive");
      if (t.heads() > 0 && t.d_model() > 0) {
        check.Require(
            t.d_model() % t.heads() == 0, "model.transformer.heads",
            std::to_string(t.heads()) + " does not divide dModel " + std::to_string(t.d_model()));
      }
      check.Require(t.dropout() >= 0 && t.dropout() < 1, "model.transformer.dropout",
                    "must be in [0, 1)");
      return;
    }
    case v1::ModelSpec::kTorchscript:
      check.Require(!model.torchscript().path().empty(), "model.torchscript.path", "is empty");
      return;
    case v1::ModelSpec::KIND_NOT_SET:
      check.Require(false, "model", "is not set (mlp, cnn, resnet, transformer or torchscript)");
      return;
  }
}

void CheckDataset(const v1::DatasetSpec& dataset, Checker& check) {
  switch (dataset.kind_case()) {
    case v1::DatasetSpec::kSynthetic: {
      const auto& s = dataset.synthetic();
      check.Require(s.num_samples() > 0, "dataset.synthetic.numSamples", "must be positive");
      check.Require(s.num_features() > 0, "dataset.synthetic.numFeatures", "must be positive");
      if (s.task() == v1::SyntheticDataset::CLASSIFICATION) {
        check.Require(s.num_classes() >= 2, "dataset.synthetic.numClasses", "must be at least 2");
      }
      check.Require(s.noise() >= 0, "dataset.synthetic.noise", "must not be negative");
      break;
    }
    case v1::DatasetSpec::kCsv:
      check.Require(!dataset.csv().path().empty(), "dataset.csv.path", "is empty");
      check.Require(dataset.csv().delimiter().size() <= 1, "dataset.csv.delimiter",
                    "must be one character");
      break;
    case v1::DatasetSpec::kIdx:
      check.Require(!dataset.idx().images_path().empty(), "dataset.idx.imagesPath", "is empty");
      check.Require(!dataset.idx().labels_path().empty(), "dataset.idx.labelsPath", "is empty");
      break;
    case v1::DatasetSpec::kText:
      check.Require(!dataset.text().path().empty(), "dataset.text.path", "is empty");
      break;
    case v1::DatasetSpec::KIND_NOT_SET:
      check.Require(false, "dataset", "is not set (synthetic, csv, idx or text)");
      break;
  }
  check.Require(dataset.validation_fraction() >= 0 && dataset.validation_fraction() < 1,
                "dataset.validationFraction", "must be in [0, 1)");
  check.Require(dataset.prefetch_batches() >= 0, "dataset.prefetchBatches", "must not be negative");
}

template <typename Adam>
void CheckAdam(const Adam& adam, const std::string& prefix, Checker& check) {
  check.Require(adam.lr() > 0 && std::isfinite(adam.lr()), prefix + ".lr", "must be positive");
  check.Require(!adam.has_beta1() || (adam.beta1() >= 0 && adam.beta1() < 1), prefix + ".beta1",
                "must be in [0, 1)");
  check.Require(!adam.has_beta2() || (adam.beta2() >= 0 && adam.beta2() < 1), prefix + ".beta2",
                "must be in [0, 1)");
  check.Require(!adam.has_eps() || adam.eps() > 0, prefix + ".eps", "must be positive");
  check.Require(!adam.has_weight_decay() || adam.weight_decay() >= 0, prefix + ".weightDecay",
                "must not be negative");
}

void CheckOptimizer(const v1::OptimizerSpec& optimizer, Checker& check) {
  switch (optimizer.kind_case()) {
    case v1::OptimizerSpec::kSgd: {
      const auto& sgd = optimizer.sgd();
      check.Require(sgd.lr() > 0 && std::isfinite(sgd.lr()), "optimizer.sgd.lr",
                    "must be positive");
      check.Require(sgd.momentum() >= 0, "optimizer.sgd.momentum", "must not be negative");
      check.Require(sgd.weight_decay() >= 0, "optimizer.sgd.weightDecay", "must not be negative");
      if (sgd.nesterov()) {
        check.Require(sgd.momentum() > 0 && sgd.dampening() == 0, "optimizer.sgd.nesterov",
                      "needs momentum > 0 and dampening 0");
      }
      return;
    }
    case v1::OptimizerSpec::kAdam:
      CheckAdam(optimizer.adam(), "optimizer.adam", check);
      return;
    case v1::OptimizerSpec::kAdamw:
      CheckAdam(optimizer.adamw(), "optimizer.adamw", check);
      return;
    case v1::OptimizerSpec::KIND_NOT_SET:
      check.Require(false, "optimizer", "is not set (sgd, adam or adamw)");
      return;
  }
}

// The engine-efficiency settings and the combinations the engine does not support, refused
// here so that none is silently ignored.
void CheckEfficiency(const v1::JobSpec& spec, Checker& check) {
  const auto& distributed = spec.distributed();
  const bool powersgd = distributed.comm_hook() == v1::DistributedSpec::POWER_SGD;
  if (distributed.has_power_sgd()) {
    const auto& p = distributed.power_sgd();
    check.Require(powersgd, "distributed.powerSgd",
                  "is set but distributed.commHook is not POWER_SGD");
    check.Require(p.matrix_approximation_rank() >= 0 && p.matrix_approximation_rank() <= 1024,
                  "distributed.powerSgd.matrixApproximationRank", "must be between 0 and 1024");
    check.Require(!p.has_start_step() || p.start_step() >= 0, "distributed.powerSgd.startStep",
                  "must not be negative");
    check.Require(p.min_compression_rate() == 0 || p.min_compression_rate() >= 1,
                  "distributed.powerSgd.minCompressionRate", "must be 0 (default 2) or at least 1");
  }
  if (distributed.has_local_sgd()) {
    const auto& local = distributed.local_sgd();
    check.Require(local.period() >= 1, "distributed.localSgd.period", "must be at least 1");
    check.Require(local.warmup_steps() >= 0, "distributed.localSgd.warmupSteps",
                  "must not be negative");
    check.Require(distributed.comm_hook() == v1::DistributedSpec::NONE, "distributed.localSgd",
                  "cannot be combined with distributed.commHook (its synchronous steps reduce "
                  "uncompressed)");
    check.Require(!distributed.shard_optimizer_state(), "distributed.localSgd",
                  "cannot be combined with distributed.shardOptimizerState (each rank's local "
                  "step needs the whole optimizer state)");
  }
}

// What the trainer would find when it loads a synthetic dataset, which the spec describes
// entirely: its samples' width and the outputs an MLP needs. (A file's shape is known only once
// the trainer reads it.)
void CheckMlpFitsSyntheticData(const v1::JobSpec& spec, Checker& check) {
  const auto& data = spec.dataset().synthetic();
  const auto& layers = spec.model().mlp().layers();
  if (layers.size() < 2 || data.num_features() <= 0) return;
  check.Require(layers[0] == data.num_features(), "model.mlp.layers[0]",
                std::to_string(layers[0]) + " inputs but the dataset's samples have " +
                    std::to_string(data.num_features()) + " features");
  const bool regression = data.task() != v1::SyntheticDataset::CLASSIFICATION;
  const int64_t outputs = regression ? 1 : data.num_classes();
  if (outputs <= 0) return;
  check.Require(layers[layers.size() - 1] == outputs,
                "model.mlp.layers[" + std::to_string(layers.size() - 1) + "]",
                std::to_string(layers[layers.size() - 1]) + " outputs but the dataset needs " +
                    std::to_string(outputs) + (regression ? " (regression)" : " (one per class)"));
}

// Each data-parallel replica (a rank, or a pipeline's stages together) trains on at most
// ceil(numSamples / replicas) examples of a synthetic dataset: fewer than one optimizer step's
// micro-batches is refused by the trainer, so here.
void CheckBatchFitsSyntheticData(const v1::JobSpec& spec, Checker& check) {
  const int64_t samples = spec.dataset().synthetic().num_samples();
  const Parallelism parallelism = ParallelismOf(spec);
  const int64_t replicas = parallelism.replicas;
  const std::string replica = parallelism.pipelined() ? "pipeline replica" : "rank";
  const int64_t per_step =
      int64_t{spec.batch_size_per_rank()} * std::max(1, spec.grad_accumulation_steps());
  if (samples <= 0 || per_step <= 0) return;
  const int64_t per_replica = (samples + replicas - 1) / replicas;
  check.Require(
      per_step <= per_replica, "batchSizePerRank",
      absl::StrCat(spec.batch_size_per_rank(), " x ", std::max(1, spec.grad_accumulation_steps()),
                   " micro-batches exceed the at most ", per_replica, " training examples of each ",
                   replica, " (dataset.synthetic.numSamples ", samples, " over ", replicas, " ",
                   replica, "s)"));
}

// The model and the dataset the trainer would refuse together, where the spec alone says so.
void CheckModelFitsDataset(const v1::JobSpec& spec, Checker& check) {
  const bool text = spec.dataset().has_text();
  const bool transformer = spec.model().has_transformer();
  if (text && spec.model().kind_case() != v1::ModelSpec::KIND_NOT_SET) {
    check.Require(transformer, "model", "a text dataset trains the transformer model only");
  }
  if (transformer && spec.dataset().kind_case() != v1::DatasetSpec::KIND_NOT_SET) {
    check.Require(text, "model.transformer",
                  "is a character language model and needs a text dataset");
  }
  if (spec.dataset().has_synthetic()) {
    if (spec.model().has_mlp()) CheckMlpFitsSyntheticData(spec, check);
    CheckBatchFitsSyntheticData(spec, check);
  }
}

// precision FP16 trains with a dynamic loss scaler, which every rank must keep in step: it
// skips a step whose gradients overflowed, and all ranks must skip the same steps. Refused:
//   backend GLOO  Gloo trains on the CPU, whose autocast has no float16 (CudaOnlySettings);
//   localSgd      its local steps sync no gradients, so ranks would overflow, skip and scale
//                 apart, and the scaler's state would become per-rank state;
//   POWER_SGD     its error feedback and warm-start Q would take in the scaled gradients, an
//                 overflow's inf included, and carry them into every later step.
// shardOptimizerState works: every rank unscales the same averaged gradients.
void CheckPrecision(const v1::JobSpec& spec, Checker& check) {
  if (spec.precision() != v1::JobSpec::FP16) return;
  if (TrainsOnCpu(spec)) {
    for (SpecIssue& issue : CudaOnlySettings(spec, "backend GLOO trains on the CPU")) {
      check.Require(false, std::move(issue.field), std::move(issue.message));
    }
  }
  const auto& distributed = spec.distributed();
  check.Require(!distributed.has_local_sgd(), "distributed.localSgd",
                "cannot be combined with precision FP16 (ranks would skip different overflowed "
                "steps): use BF16 or FP32, or synchronous training");
  check.Require(distributed.comm_hook() != v1::DistributedSpec::POWER_SGD, "distributed.commHook",
                "POWER_SGD cannot be combined with precision FP16 (its error feedback would keep "
                "overflowed gradients): use FP16 or BF16 compression, or precision BF16");
}

}  // namespace

std::vector<SpecIssue> CudaOnlySettings(const v1::JobSpec& spec, const std::string& where) {
  std::vector<SpecIssue> issues;
  if (spec.distributed().backend() == v1::DistributedSpec::NCCL) {
    issues.push_back({"distributed.backend",
                      "NCCL needs a GPU node; " + where +
                          ": use AUTO or GLOO there, or a nodeSelector that picks GPU nodes"});
  }
  if (spec.precision() == v1::JobSpec::FP16) {
    issues.push_back(
        {"precision", "FP16 (autocast to float16 with dynamic loss scaling) needs a CUDA GPU; " +
                          where +
                          ": use BF16 (autocast to bfloat16) or FP32, or backend NCCL on a GPU "
                          "node"});
  }
  return issues;
}

bool NeedsCuda(const v1::JobSpec& spec) { return !CudaOnlySettings(spec, "").empty(); }

bool TrainsOnCpu(const v1::JobSpec& spec) {
  return spec.distributed().backend() == v1::DistributedSpec::GLOO;
}

bool RunsOnGlooOnly(const v1::JobSpec& spec) {
  return spec.parallelism().pipeline_stages() > 1 &&
         spec.parallelism().schedule() == v1::ParallelismSpec::INTERLEAVED_ONE_F_ONE_B;
}

void CheckRankDevice(const v1::JobSpec& spec, RankDevice device, const RankDeviceRules& rules) {
  if (device == RankDevice::kCuda && !TrainsOnCpu(spec)) return;
  const std::string where = device == RankDevice::kCpu
                                ? "this rank runs on a CPU node (GRADHUB_DEVICE=cpu)"
                                : "backend GLOO trains on the CPU";
  for (const SpecIssue& issue : CudaOnlySettings(spec, where)) {
    if (issue.field == "precision" && rules.allow_fp16_on_cpu) continue;
    throw UserError(issue.field, issue.message);
  }
}

v1::JobSpec ParseJobSpec(const std::string& text) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& error) {
    throw UserError("", std::string("spec is not valid YAML or JSON: ") + error.what());
  }
  if (!root.IsMap()) throw UserError("", "spec must be a mapping of fields");
  std::string json;
  ToJson(root, 0, &json);
  v1::JobSpec spec;
  const absl::Status status = ParseProtoJson(json, &spec, {.case_insensitive_enums = true});
  if (!status.ok()) throw UserError("", "spec: " + std::string(status.message()));
  return spec;
}

v1::JobSpec LoadJobSpec(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw UserError("", path + ": cannot read the job spec");
  std::stringstream text;
  text << in.rdbuf();
  try {
    return ParseJobSpec(text.str());
  } catch (const UserError& error) {
    throw UserError(error.field(), path + ": " + error.what());
  }
}

namespace {

constexpr size_t kMaxDisplayNameCharacters = 256;
constexpr size_t kMaxLabelCharacters = 63;
constexpr int64_t kMaxMemoryPerRankMib = int64_t{1} << 24;
constexpr int32_t kMaxCollectiveTimeoutSeconds = 86400;

// distributed.encryptTraffic encrypts what the gradhub process group sends between hosts: Gloo
// (GLOO, or AUTO where it picks Gloo) can, NCCL cannot, and a script job's ranks bring their
// own process group, which gradhub does not reach.
void CheckEncryptTraffic(const v1::JobSpec& spec, Checker& check) {
  if (!spec.distributed().encrypt_traffic()) return;
  if (spec.has_script()) {
    check.Require(false, "distributed.encryptTraffic",
                  "a script job chooses its own transport, which gradhub cannot encrypt: leave "
                  "it out and encrypt in the script");
    return;
  }
  check.Require(spec.distributed().backend() != v1::DistributedSpec::NCCL,
                "distributed.encryptTraffic",
                "needs backend GLOO or AUTO: NCCL has no encrypted transport");
}

// distributed.collectiveTimeoutSeconds: 0 (the node's default) or up to a day, and below the
// hang timeout. A collective that waits as long as the watchdog does is never the one to fail:
// the watchdog stops the attempt first, as a JOB failure that names no unreachable node, so the
// next attempt may land on the same partitioned pair.
void CheckCollectiveTimeout(const v1::JobSpec& spec, Checker& check) {
  const int32_t timeout = spec.distributed().collective_timeout_seconds();
  const std::string field = "distributed.collectiveTimeoutSeconds";
  if (timeout < 0 || timeout > kMaxCollectiveTimeoutSeconds) {
    check.Require(false, field,
                  absl::StrCat("must be between 0 (the node's default) and ",
                               kMaxCollectiveTimeoutSeconds, " (a day)"));
    return;
  }
  const int32_t hang =
      spec.hang_timeout_seconds() > 0 ? spec.hang_timeout_seconds() : defaults::kHangTimeoutSeconds;
  check.Require(timeout < hang, field,
                absl::StrCat("must be below hangTimeoutSeconds (", hang,
                             "): the hang watchdog would stop the attempt before a collective "
                             "timed out and its ranks named the nodes they cannot reach"));
}

// The rules of every job, trainer or script.
void CheckCommonFields(const v1::JobSpec& spec, const SpecLimits& limits, Checker& check) {
  const std::string name_problem = TextLimitProblem(spec.display_name(), kMaxDisplayNameCharacters);
  check.Require(name_problem.empty(), "displayName", name_problem);
  for (const auto& [key, value] : spec.labels()) {
    check.Require(!key.empty() && CountCharacters(key) <= kMaxLabelCharacters &&
                      CountCharacters(value) <= kMaxLabelCharacters,
                  "labels." + key,
                  "keys must be 1 to 63 characters, values at most 63 (characters are Unicode "
                  "code points)");
  }
  check.Require(
      spec.memory_per_rank_mib() >= 0 && spec.memory_per_rank_mib() <= kMaxMemoryPerRankMib,
      "memoryPerRankMib",
      absl::StrCat("must be between 0 (the node's per-slot cap) and ", kMaxMemoryPerRankMib,
                   " (16 TiB)"));
  CheckEncryptTraffic(spec, check);
  const auto& distributed = spec.distributed();
  check.Require(distributed.world_size() >= 0 && distributed.world_size() <= limits.max_world_size,
                "distributed.worldSize",
                "must be between 1 and " + std::to_string(limits.max_world_size));
  check.Require(distributed.ranks_per_node() >= 0, "distributed.ranksPerNode",
                "must not be negative");
  CheckCollectiveTimeout(spec, check);
  check.Require(spec.checkpoint().keep_last() >= 0, "checkpoint.keepLast", "must not be negative");
  check.Require(spec.max_restarts().infrastructure() >= 0, "maxRestarts.infrastructure",
                "must not be negative");
  check.Require(spec.max_restarts().job() >= 0, "maxRestarts.job", "must not be negative");
  check.Require(spec.hang_timeout_seconds() >= 0, "hangTimeoutSeconds", "must not be negative");
}

void CheckSchedule(const v1::LrSchedule& schedule, Checker& check) {
  if (schedule.has_step()) {
    check.Require(schedule.step().step_size() > 0, "lrSchedule.step.stepSize", "must be positive");
    check.Require(schedule.step().gamma() > 0, "lrSchedule.step.gamma", "must be positive");
  }
  if (schedule.has_cosine()) {
    check.Require(schedule.cosine().period_steps() >= 0, "lrSchedule.cosine.periodSteps",
                  "must not be negative");
    check.Require(schedule.cosine().min_lr() >= 0, "lrSchedule.cosine.minLr",
                  "must not be negative");
  }
  check.Require(schedule.warmup_steps() >= 0, "lrSchedule.warmupSteps", "must not be negative");
}

// parallelism.* of the built-in trainer (a script job may not set it: ValidateScriptSpec; a
// pipeline's shape and combinations: CheckPipelineShape and CheckPipelineCombinations):
//   1. pipelineStages, microBatches and chunksPerStage are not negative;
//   2. pipelineStages 0 or 1 is no pipeline, so microBatches, schedule, balance and
//      chunksPerStage are refused (they would be ignored).
void CheckParallelismFields(const v1::JobSpec& spec, Checker& check) {
  const v1::ParallelismSpec& p = spec.parallelism();
  check.Require(p.pipeline_stages() >= 0, "parallelism.pipelineStages",
                "must not be negative (0 or 1: no pipeline)");
  check.Require(p.micro_batches() >= 0, "parallelism.microBatches",
                "must not be negative (0: pipelineStages)");
  check.Require(p.chunks_per_stage() >= 0, "parallelism.chunksPerStage",
                "must not be negative (0: 2)");
  if (p.pipeline_stages() > 1) return;
  const std::string ignored =
      absl::StrCat("is set but parallelism.pipelineStages is ", p.pipeline_stages(),
                   " (no pipeline), so it would be ignored: leave it out, or set "
                   "pipelineStages above 1");
  check.Require(p.micro_batches() <= 0, "parallelism.microBatches", ignored);
  check.Require(p.schedule() == v1::ParallelismSpec::ONE_F_ONE_B, "parallelism.schedule", ignored);
  check.Require(p.balance() == v1::ParallelismSpec::PARAMETERS, "parallelism.balance", ignored);
  check.Require(p.chunks_per_stage() <= 0, "parallelism.chunksPerStage", ignored);
}

// What a layer is in each zoo architecture (models/stages.h ZooLayerCount), for messages.
const char* LayersOf(const v1::ModelSpec& model) {
  switch (model.kind_case()) {
    case v1::ModelSpec::kMlp:
      return "one per Linear";
    case v1::ModelSpec::kCnn:
      return "one per conv unit, the hidden Linear and the output Linear";
    case v1::ModelSpec::kResnet:
      return "the stem, one per residual block, the head";
    case v1::ModelSpec::kTransformer:
      return "the embedding, one per block, the final norm with the head";
    default:
      return "";
  }
}

// A stage holds at least one layer (with the interleaved schedule, each of its chunks does).
// A zoo model's layers follow from the spec; a TorchScript model's (its top-level children)
// are counted when a rank loads it, and the trainer refuses there.
void CheckStagesFitTheModel(const v1::JobSpec& spec, const Parallelism& parallelism,
                            Checker& check) {
  const std::optional<int64_t> layers = models::ZooLayerCount(spec.model());
  if (!layers || *layers < 1) return;  // no model, TorchScript, or a model refused already
  const std::string what = absl::StrCat(" (", LayersOf(spec.model()), ")");
  if (parallelism.stages > *layers) {
    check.Require(false, "parallelism.pipelineStages",
                  absl::StrCat(parallelism.stages, " exceeds the model's ", *layers, " layers",
                               what, ": each stage holds at least one"));
    return;
  }
  const int64_t needed = int64_t{parallelism.stages} * parallelism.chunks_per_stage;
  check.Require(needed <= *layers, "parallelism.chunksPerStage",
                absl::StrCat(parallelism.stages, " stages x ", parallelism.chunks_per_stage,
                             " chunks need ", needed, " layers; the model has ", *layers, what));
}

// The shape of a pipeline of the built-in trainer (pipelineStages above 1):
//   1. pipelineStages divides distributed.worldSize (world = stages x replicas);
//   2. microBatches (0: pipelineStages) divides batchSizePerRank, a replica's batch;
//   3. INTERLEAVED_ONE_F_ONE_B runs rounds of pipelineStages micro-batches, so microBatches
//      must be a multiple of it, over at least 2 chunks per stage (1 is ONE_F_ONE_B), on Gloo
//      only (RunsOnGlooOnly: backend NCCL refused); chunksPerStage with another schedule
//      would be ignored and is refused;
//   4. the model has a layer for every stage (every chunk), where the spec says (above).
void CheckPipelineShape(const v1::JobSpec& spec, Checker& check) {
  const v1::ParallelismSpec& p = spec.parallelism();
  const Parallelism parallelism = ParallelismOf(spec);
  const int32_t stages = parallelism.stages, world = std::max(1, spec.distributed().world_size());
  check.Require(world % stages == 0, "parallelism.pipelineStages",
                absl::StrCat(stages, " does not divide distributed.worldSize ", world,
                             " (the world is pipelineStages x data-parallel replicas)"));
  const int32_t batch = spec.batch_size_per_rank(), micro = parallelism.micro_batches;
  if (batch > 0 && p.micro_batches() >= 0) {
    check.Require(batch % micro == 0, "parallelism.microBatches",
                  p.micro_batches() > 0
                      ? absl::StrCat(micro, " does not divide batchSizePerRank ", batch,
                                     " (a replica's batch is split into equal micro-batches)")
                      : absl::StrCat("0 means pipelineStages (", stages,
                                     "), which does not divide batchSizePerRank ", batch,
                                     ": set microBatches to a divisor of it"));
  }
  if (p.schedule() == v1::ParallelismSpec::INTERLEAVED_ONE_F_ONE_B) {
    check.Require(micro % stages == 0, "parallelism.microBatches",
                  absl::StrCat(micro, " is not a multiple of pipelineStages ", stages,
                               ": schedule INTERLEAVED_ONE_F_ONE_B runs rounds of "
                               "pipelineStages micro-batches"));
    check.Require(p.chunks_per_stage() != 1, "parallelism.chunksPerStage",
                  "1 chunk per stage is schedule ONE_F_ONE_B: use that schedule, or at least 2 "
                  "chunks (0: 2)");
    check.Require(spec.distributed().backend() != v1::DistributedSpec::NCCL, "parallelism.schedule",
                  "INTERLEAVED_ONE_F_ONE_B runs on Gloo only (its transfers go around the "
                  "replica's ring, in an order NCCL's one stream cannot take): use ONE_F_ONE_B "
                  "or GPIPE, or backend GLOO or AUTO (which places it on CPU nodes)");
  } else {
    check.Require(p.chunks_per_stage() == 0, "parallelism.chunksPerStage",
                  absl::StrCat("is only for schedule INTERLEAVED_ONE_F_ONE_B; schedule ",
                               v1::ParallelismSpec::Schedule_Name(p.schedule()),
                               " runs one chunk per stage"));
  }
  if (p.chunks_per_stage() >= 0) CheckStagesFitTheModel(spec, parallelism, check);
}

// What the pipeline engine does not do, each refused naming the setting that asks for it.
// Each stage's DistributedDataParallel averages its gradients over the stage's replicas, and
// what only needs that works: commHook FP16 and BF16 (stateless bucket compression),
// findUnusedParameters, bucketCapMb, encryptTraffic (point-to-point messages are sealed too),
// BF16, gradAccumulationSteps (the pipeline runs that many batches before the optimizer
// step), gradClipNorm (the trainer sums the squared norms over every stage). Refused, because
// they need state or agreement across stages that is not built:
//   shardOptimizerState  ZeRO shards over every rank, but each stage holds other parameters;
//   localSgd             its parameter averages run over every rank, likewise;
//   POWER_SGD            its error feedback and warm-start state are per model, not per stage;
//   precision FP16       each stage's loss scaler sees only its stage's gradients, so stages
//                        would skip different overflowed steps.
void CheckPipelineCombinations(const v1::JobSpec& spec, Checker& check) {
  const std::string with = absl::StrCat("cannot be combined with parallelism.pipelineStages ",
                                        spec.parallelism().pipeline_stages());
  const auto& distributed = spec.distributed();
  check.Require(!distributed.shard_optimizer_state(), "distributed.shardOptimizerState",
                with +
                    " (ZeRO shards the optimizer state over every rank, but each stage holds "
                    "other parameters): leave one out");
  check.Require(!distributed.has_local_sgd(), "distributed.localSgd",
                with +
                    " (its parameter averages run over every rank, but each stage holds other "
                    "parameters): leave one out");
  check.Require(distributed.comm_hook() != v1::DistributedSpec::POWER_SGD, "distributed.commHook",
                "POWER_SGD " + with +
                    " (its error feedback and warm-start state belong to one whole model, not "
                    "to each stage): use NONE, FP16 or BF16");
  check.Require(spec.precision() != v1::JobSpec::FP16, "precision",
                "FP16 " + with +
                    " (each stage's loss scaler sees only its own gradients, so stages would "
                    "skip different overflowed steps): use BF16 or FP32");
}

// The rules of the built-in trainer's fields.
void CheckTrainerFields(const v1::JobSpec& spec, Checker& check) {
  CheckModel(spec.model(), check);
  CheckDataset(spec.dataset(), check);
  CheckOptimizer(spec.optimizer(), check);
  CheckSchedule(spec.lr_schedule(), check);
  check.Require(spec.batch_size_per_rank() > 0, "batchSizePerRank", "must be positive");
  check.Require(spec.grad_accumulation_steps() >= 0, "gradAccumulationSteps",
                "must not be negative");
  check.Require(spec.max_steps() >= 0, "maxSteps", "must not be negative");
  check.Require(spec.max_epochs() >= 0, "maxEpochs", "must not be negative");
  check.Require(spec.max_steps() > 0 || spec.max_epochs() > 0, "maxSteps",
                "set maxSteps or maxEpochs");
  check.Require(spec.eval_every_steps() >= 0, "evalEverySteps", "must not be negative");
  check.Require(spec.log_every_steps() >= 0, "logEverySteps", "must not be negative");
  check.Require(spec.grad_clip_norm() >= 0, "gradClipNorm", "must not be negative");
  check.Require(
      spec.distributed().bucket_cap_mb() >= 0 && spec.distributed().bucket_cap_mb() <= 1024,
      "distributed.bucketCapMb", "must be between 0 and 1024");
  CheckEfficiency(spec, check);
  CheckPrecision(spec, check);
  CheckModelFitsDataset(spec, check);
  CheckParallelismFields(spec, check);
  if (spec.parallelism().pipeline_stages() > 1) {
    CheckPipelineShape(spec, check);
    CheckPipelineCombinations(spec, check);
  }
  check.Require(spec.checkpoint().every_steps() >= 0, "checkpoint.everySteps",
                "must not be negative");
}

}  // namespace

std::vector<SpecIssue> ValidateJobSpec(const v1::JobSpec& spec, const SpecLimits& limits) {
  Checker check;
  for (SpecIssue& issue : ProtoValueIssues(spec)) check.Unmeant(std::move(issue));
  CheckCommonFields(spec, limits, check);
  if (spec.has_script()) {
    for (SpecIssue& issue : ValidateScriptSpec(spec)) {
      check.Require(false, std::move(issue.field), std::move(issue.message));
    }
  } else {
    CheckTrainerFields(spec, check);
  }
  return check.Take();
}

void CheckJobSpec(const v1::JobSpec& spec, const SpecLimits& limits) {
  std::vector<SpecIssue> issues = ValidateJobSpec(spec, limits);
  if (issues.empty()) return;
  std::string message = "invalid job spec:";
  for (const SpecIssue& issue : issues) message += "\n  " + issue.field + ": " + issue.message;
  throw UserError("", message);
}

Parallelism ParallelismOf(const v1::JobSpec& spec) {
  const v1::ParallelismSpec& p = spec.parallelism();
  Parallelism parallelism;
  parallelism.stages = std::max(1, p.pipeline_stages());
  parallelism.replicas =
      std::max(1, std::max(1, spec.distributed().world_size()) / parallelism.stages);
  if (!parallelism.pipelined()) return parallelism;
  parallelism.micro_batches = p.micro_batches() > 0 ? p.micro_batches() : parallelism.stages;
  if (p.schedule() == v1::ParallelismSpec::INTERLEAVED_ONE_F_ONE_B) {
    parallelism.chunks_per_stage = p.chunks_per_stage() > 0 ? p.chunks_per_stage() : 2;
  }
  return parallelism;
}

int64_t GlobalBatchSize(const v1::JobSpec& spec) {
  return int64_t{spec.batch_size_per_rank()} * ParallelismOf(spec).replicas *
         std::max(1, spec.grad_accumulation_steps());
}

v1::JobSpec WithDefaults(v1::JobSpec spec) {
  auto* distributed = spec.mutable_distributed();
  if (distributed->world_size() == 0) distributed->set_world_size(1);
  if (spec.hang_timeout_seconds() == 0) {
    spec.set_hang_timeout_seconds(defaults::kHangTimeoutSeconds);
  }
  if (spec.checkpoint().keep_last() == 0) spec.mutable_checkpoint()->set_keep_last(3);
  if (spec.has_script()) {  // none of the trainer's defaults: ValidateScriptSpec refuses them
    if (spec.script().interpreter().empty()) {
      spec.mutable_script()->set_interpreter(kDefaultScriptInterpreter);
    }
    return spec;
  }
  if (distributed->bucket_cap_mb() == 0) distributed->set_bucket_cap_mb(25);
  // pipelineStages 0 stays 0 (= 1): a spec without a pipeline keeps its bytes, which the
  // checkpoints of jobs submitted before parallelism existed compare against.
  if (const Parallelism parallelism = ParallelismOf(spec); parallelism.pipelined()) {
    auto* p = spec.mutable_parallelism();
    p->set_micro_batches(parallelism.micro_batches);
    if (p->schedule() == v1::ParallelismSpec::INTERLEAVED_ONE_F_ONE_B) {
      p->set_chunks_per_stage(parallelism.chunks_per_stage);
    }
  }
  if (distributed->comm_hook() == v1::DistributedSpec::POWER_SGD) {
    auto* powersgd = distributed->mutable_power_sgd();
    if (powersgd->matrix_approximation_rank() == 0) powersgd->set_matrix_approximation_rank(1);
    if (!powersgd->has_start_step()) powersgd->set_start_step(10);
    if (powersgd->min_compression_rate() == 0) powersgd->set_min_compression_rate(2);
    if (!powersgd->has_error_feedback()) powersgd->set_error_feedback(true);
    if (!powersgd->has_warm_start()) powersgd->set_warm_start(true);
  }
  if (spec.grad_accumulation_steps() == 0) spec.set_grad_accumulation_steps(1);
  if (spec.log_every_steps() == 0) spec.set_log_every_steps(10);
  if (spec.dataset().prefetch_batches() == 0) spec.mutable_dataset()->set_prefetch_batches(2);
  return spec;
}

}  // namespace gradhub
