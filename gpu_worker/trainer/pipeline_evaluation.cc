#include "gpu_worker/trainer/pipeline_evaluation.h"

#include <torch/torch.h>

#include <optional>
#include <stdexcept>

#include "gpu_worker/ddp/pipeline/stage_autograd.h"

namespace gradhub::trainer {
namespace {

using ddp::pipeline::kMaxActivationDims;
using ddp::pipeline::MessageKind;
using ddp::pipeline::MessageTag;
using ddp::pipeline::StageTraffic;

constexpr int kEvaluationMicroBatch = ddp::pipeline::kMaxMicroBatches - 1;
constexpr int64_t kHeaderSize = 2 + kMaxActivationDims;  // dims, dtype, sizes

// The output of virtual stage `boundary` to the next one: its header, then its values.
void SendOutput(StageTraffic& traffic, const at::Tensor& output, int to, int boundary) {
  if (output.dim() > kMaxActivationDims) {
    throw std::invalid_argument("an activation has " + std::to_string(output.dim()) +
                                " dimensions; a pipeline passes at most " +
                                std::to_string(kMaxActivationDims));
  }
  std::vector<int64_t> header(kHeaderSize, 0);
  header[0] = output.dim();
  header[1] = static_cast<int64_t>(output.scalar_type());
  for (int64_t d = 0; d < output.dim(); ++d) header[2 + d] = output.size(d);
  traffic.Send(torch::tensor(header, at::kLong).to(traffic.device()), to,
               MessageTag(MessageKind::kActivationShape, boundary, kEvaluationMicroBatch));
  traffic.Send(output.contiguous(), to,
               MessageTag(MessageKind::kActivation, boundary, kEvaluationMicroBatch));
}

at::Tensor ReceiveInput(StageTraffic& traffic, int from, int boundary) {
  const auto longs = at::TensorOptions().dtype(at::kLong).device(traffic.device());
  const at::Tensor header = torch::empty({kHeaderSize}, longs);
  traffic.Receive(header, from,
                  MessageTag(MessageKind::kActivationShape, boundary, kEvaluationMicroBatch));
  const at::Tensor values = header.cpu();
  const int64_t* h = values.data_ptr<int64_t>();
  const std::vector<int64_t> sizes(h + 2, h + 2 + h[0]);
  const auto dtype = static_cast<c10::ScalarType>(h[1]);
  at::Tensor input = torch::empty(sizes, at::TensorOptions().dtype(dtype).device(traffic.device()));
  traffic.Receive(input, from,
                  MessageTag(MessageKind::kActivation, boundary, kEvaluationMicroBatch));
  return input;
}

// One rank's walk through the validation batches (steps 1-2).
class EvaluationWalk {
 public:
  EvaluationWalk(const PassContext& context, const ddp::pipeline::PipelineLayout& layout)
      : context_(context),
        layout_(layout),
        traffic_(context.world, context.device),
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
    traffic_.WaitForSends();
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
          at == 0 ? x : ReceiveInput(traffic_, layout_.PreviousRank(rank), at - 1);
      PrecisionScope precision(context_.plan.autocast, context_.device.type());
      const at::Tensor output = context_.model.pieces[static_cast<size_t>(c)]->Forward(input);
      if (at == last) {
        sums_.Add(context_.dataset.shape().task, output, y);
      } else {
        SendOutput(traffic_, output, layout_.NextRank(rank), at);
      }
      traffic_.ReleaseCompletedSends();
    }
  }

  const PassContext& context_;
  const ddp::pipeline::PipelineLayout& layout_;
  StageTraffic traffic_;
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
