#include "gpu_worker/trainer/pipeline_evaluation.h"

#include <torch/torch.h>

#include <optional>
#include <stdexcept>

#include "gpu_worker/ddp/pipeline/stage_autograd.h"

namespace gradhub::trainer {
namespace {

using ddp::pipeline::Crossing;
using ddp::pipeline::ReceiveActivationValues;
using ddp::pipeline::SendActivationValues;
using ddp::pipeline::StageTraffic;

// Every batch's messages carry this micro-batch in their tags, apart from training's.
constexpr int kEvaluationMicroBatch = ddp::pipeline::kMaxMicroBatches - 1;

// One rank's walk through the validation batches (steps 1-2).
class EvaluationWalk {
 public:
  EvaluationWalk(const PassContext& context, const ddp::pipeline::PipelineLayout& layout)
      : context_(context),
        layout_(layout),
        traffic_(std::make_shared<StageTraffic>(context.world, context.device)),
        sums_(context.device) {}

  EvalSums Run(const std::vector<int64_t>& mine) {
    const PipelinePlan& pipeline = context_.plan.pipeline;
    const int64_t batch = context_.plan.batches.per_rank;
    const int64_t batches = (static_cast<int64_t>(mine.size()) + batch - 1) / batch;
    std::optional<data::BatchLoader> loader;
    if (pipeline.first_stage() || pipeline.last_stage()) {
      loader.emplace(context_.dataset, mine, batch, /*drop_last=*/false, /*prefetch=*/2,
                     /*start_batch=*/0, /*pin_memory=*/context_.device.is_cuda());
    }
    torch::NoGradGuard no_grad;
    at::Tensor x, y;
    for (int64_t b = 0; b < batches; ++b) {
      if (loader && !loader->Next(&x, &y)) throw std::logic_error("validation loader ended early");
      ForwardBatch(OnDevice(x), OnDevice(y));
    }
    traffic_->WaitForSends();
    return sums_;
  }

 private:
  // The stages between the first and the last have no batch.
  at::Tensor OnDevice(const at::Tensor& t) const {
    return t.defined() ? ToDevice(t, context_.device) : t;
  }

  void ForwardBatch(const at::Tensor& x, const at::Tensor& y) {
    const PipelinePlan& pipeline = context_.plan.pipeline;
    const int rank = context_.plan.rank;
    const int last = pipeline.stages * pipeline.chunks_per_stage - 1;
    for (int c = 0; c < pipeline.chunks_per_stage; ++c) {
      const int at = c * pipeline.stages + pipeline.stage;
      const at::Tensor input =
          at == 0 ? x
                  : ReceiveActivationValues(Crossing{traffic_, layout_.PreviousRank(rank), at - 1,
                                                     kEvaluationMicroBatch});
      PrecisionScope precision(context_.plan.autocast, context_.device.type());
      const at::Tensor output = context_.model.pieces[static_cast<size_t>(c)]->Forward(input);
      if (at == last) {
        sums_.Add(context_.dataset.shape().task, output, y);
      } else {
        SendActivationValues(output,
                             Crossing{traffic_, layout_.NextRank(rank), at, kEvaluationMicroBatch});
      }
      traffic_->ReleaseCompletedSends();
    }
  }

  const PassContext& context_;
  const ddp::pipeline::PipelineLayout& layout_;
  const std::shared_ptr<StageTraffic> traffic_;
  EvalSums sums_;
};

void SetTraining(const RankModel& model, bool training) {
  for (const auto& piece : model.pieces) piece->module()->train(training);
}

}  // namespace

EvalResult EvaluatePipeline(const PassContext& context, const ddp::pipeline::PipelineLayout& layout,
                            const std::vector<int64_t>& validation) {
  const PipelinePlan& pipeline = context.plan.pipeline;
  const std::vector<int64_t> mine =
      EvaluationShare(validation, pipeline.replica, pipeline.replicas);
  SetTraining(context.model, false);
  const EvalSums sums = EvaluationWalk(context, layout).Run(mine);
  SetTraining(context.model, true);
  return sums.Reduce(*context.world, context.dataset.shape().task);
}

}  // namespace gradhub::trainer
