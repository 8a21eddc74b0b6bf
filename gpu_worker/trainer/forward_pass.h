// The forward of a batch as training and evaluation both run it: on the training device,
// under the plan's autocast, with the task's loss; and the evaluation, which is only that.
// Not thread-safe: autocast state is the calling thread's.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "gpu_worker/common/data_shape.h"
#include "gpu_worker/data/dataset.h"
#include "gpu_worker/ddp/comm/process_group.h"
#include "gpu_worker/ddp/mixed_precision.h"
#include "gpu_worker/models/model.h"
#include "gpu_worker/trainer/training_plan.h"

namespace gradhub::trainer {

// The mean loss of a batch: cross entropy for classes and next tokens, mean squared error
// for regression.
at::Tensor Loss(Task task, const at::Tensor& output, const at::Tensor& target);

// A batch onto the training device. From pinned memory (BatchLoader's pin_memory) the copy is
// asynchronous: queued on the stream ahead of the step's kernels, with no wait on the host.
at::Tensor ToDevice(const at::Tensor& tensor, const c10::Device& device);

// Forward and loss in its scope run under the plan's autocast (training_plan.h Autocast) on
// `device`, the training device's type; nothing changes for Autocast::kNone.
class PrecisionScope {
 public:
  PrecisionScope(Autocast autocast, c10::DeviceType device);

 private:
  std::optional<ddp::AutocastGuard> autocast_;
};

struct EvalResult {
  double loss = 0;
  std::map<std::string, double> metrics;
};

// The validation sums of one rank: loss times items, correct predictions, items. They stay on
// the device (float64) until reduced: one read of three numbers per evaluation.
class EvalSums {
 public:
  explicit EvalSums(const c10::Device& device);
  // A batch's model output and targets.
  void Add(Task task, const at::Tensor& output, const at::Tensor& target);
  // The sums over `group`'s ranks (a collective; a rank that saw no batch adds zeros), as the
  // metrics: loss, accuracy for classes, perplexity for next tokens.
  EvalResult Reduce(ddp::ProcessGroup& group, Task task) const;

 private:
  at::Tensor loss_, correct_;
  double count_ = 0;
};

// The validation examples of shard `shard` of `shards`: every shards-th from the shard's.
std::vector<int64_t> EvaluationShare(const std::vector<int64_t>& validation, int shard, int shards);

// Each rank evaluates every world_size-th validation example in batches of the plan's
// batchSizePerRank; sums are reduced over `group` so every rank reports the same numbers
// (a collective). The sums stay on `device` (float64) until reduced: one read of three numbers
// per evaluation, not one per batch. Leaves the model in training mode.
EvalResult Evaluate(models::Model& model, const data::Dataset& dataset,
                    const std::vector<int64_t>& validation, const TrainingPlan& plan,
                    ddp::ProcessGroup& group, const c10::Device& device);

}  // namespace gradhub::trainer
