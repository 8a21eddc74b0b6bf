#include "gpu_worker/trainer/pipeline_training.h"

#include <torch/torch.h>

#include <algorithm>
#include <stdexcept>

#include "gpu_worker/trainer/pipeline_evaluation.h"

namespace gradhub::trainer {
namespace {

namespace pipeline = ddp::pipeline;

double Seconds(std::chrono::nanoseconds duration) {
  return std::chrono::duration<double>(duration).count();
}

// ONE_F_ONE_B is Megatron-LM's on GPUs (NCCL: messages take microseconds, memory is short)
// and the deep warm-up on CPU ranks (Gloo: a message's latency is a fraction of a millisecond,
// which Megatron-LM's order pays once per micro-batch; schedule.h).
pipeline::PipelineSchedule ScheduleOf(v1::ParallelismSpec::Schedule schedule,
                                      const c10::Device& device) {
  switch (schedule) {
    case v1::ParallelismSpec::GPIPE:
      return pipeline::PipelineSchedule::kGPipe;
    case v1::ParallelismSpec::INTERLEAVED_ONE_F_ONE_B:
      return pipeline::PipelineSchedule::kInterleavedOneFOneB;
    default:
      return device.is_cuda() ? pipeline::PipelineSchedule::kOneFOneB
                              : pipeline::PipelineSchedule::kOneFOneBDeepWarmup;
  }
}

// Step 1: every stage's group made on every rank, in stage order; this stage's kept.
std::shared_ptr<ddp::ProcessGroup> StageGroup(const ddp::ProcessGroupOptions& world_options,
                                              const pipeline::PipelineLayout& layout, int stage) {
  std::shared_ptr<ddp::ProcessGroup> mine;
  for (int s = 0; s < layout.stages(); ++s) {
    std::shared_ptr<ddp::ProcessGroup> group =
        ddp::CreateSubgroup(world_options, layout.DataParallelRanks(s));
    if (s == stage) mine = std::move(group);
  }
  return mine;
}

// The chunks' forwards, under the plan's autocast, each through its DDP when there is one.
std::vector<pipeline::StageChunk> Chunks(
    const PassContext& context,
    const std::vector<std::unique_ptr<ddp::DistributedDataParallel>>& ddps) {
  std::vector<pipeline::StageChunk> chunks;
  for (size_t c = 0; c < context.model.pieces.size(); ++c) {
    models::Model* piece = context.model.pieces[c].get();
    const Autocast autocast = context.plan.autocast;
    const c10::DeviceType device = context.device.type();
    pipeline::StageChunk chunk;
    chunk.forward = [piece, autocast, device](const at::Tensor& x) {
      PrecisionScope precision(autocast, device);
      return piece->Forward(x);
    };
    chunk.ddp = ddps.empty() ? nullptr : ddps[c].get();
    chunks.push_back(std::move(chunk));
  }
  return chunks;
}

pipeline::LossFunction LossOf(const PassContext& context) {
  const Task task = context.dataset.shape().task;
  const Autocast autocast = context.plan.autocast;
  const c10::DeviceType device = context.device.type();
  return [task, autocast, device](const at::Tensor& output, const at::Tensor& target) {
    PrecisionScope precision(autocast, device);
    return Loss(task, output, target);
  };
}

pipeline::PipelineStageOptions StageOptions(const PassContext& context) {
  const PipelinePlan& plan = context.plan.pipeline;
  pipeline::PipelineStageOptions options;
  options.schedule = ScheduleOf(plan.schedule, context.device);
  options.micro_batches = plan.micro_batches;
  options.chunks_per_stage = plan.chunks_per_stage;
  options.device = context.device;
  return options;
}

}  // namespace

PipelinePass::PipelinePass(const PassContext& context,
                           const ddp::ProcessGroupOptions& world_options)
    : context_(context), layout_(context.plan.world_size, context.plan.pipeline.stages) {
  if (layout_.replicas() > 1) {
    stage_group_ = StageGroup(world_options, layout_, context.plan.pipeline.stage);
    for (const auto& piece : context.model.pieces) {  // step 2
      chunk_ddps_.push_back(std::make_unique<ddp::DistributedDataParallel>(
          piece->module(), stage_group_, context.rule.GradientSyncOptions()));
    }
  }
  stage_ = std::make_unique<pipeline::PipelineStage>(  // step 3
      context.world, layout_, StageOptions(context), Chunks(context, chunk_ddps_),
      context.plan.pipeline.last_stage() ? LossOf(context) : nullptr);
}

PipelinePass::~PipelinePass() = default;

void PipelinePass::ZeroGrad() {
  if (chunk_ddps_.empty()) {
    context_.model.module->zero_grad();
    return;
  }
  for (const auto& ddp : chunk_ddps_) ddp->ZeroGrad();
}

at::Tensor PipelinePass::Run(data::BatchLoader& loader, bool sync, StepReport& report) {
  const PipelinePlan& plan = context_.plan.pipeline;
  const int64_t accumulation = context_.plan.batches.accumulation;
  pipeline::StepControl control;
  control.loss_for_backward = [this, accumulation](const at::Tensor& loss) {
    return context_.rule.LossForBackward(loss / accumulation);
  };
  at::Tensor step_loss = torch::zeros({}, at::TensorOptions(at::kDouble).device(context_.device));
  StepSums sums;
  at::Tensor x, y;
  for (int64_t micro = 0; micro < accumulation; ++micro) {
    if (!loader.Next(&x, &y)) throw std::logic_error("data loader ended before the epoch");
    pipeline::StepBatch batch;
    if (plan.first_stage()) batch.inputs = ToDevice(x, context_.device);
    if (plan.last_stage()) batch.targets = ToDevice(y, context_.device);
    control.sync_gradients = sync && micro + 1 == accumulation;
    const pipeline::StageStepReport stage = stage_->Step(batch, control);
    if (stage.loss.defined()) step_loss += stage.loss / accumulation;
    AddStageReport(stage, sums, report);
  }
  report.pipeline.stage = plan.stage;
  const double idle = sums.step_seconds - sums.forward_seconds - sums.backward_seconds;
  report.pipeline.bubble_fraction = sums.step_seconds > 0 ? idle / sums.step_seconds : 0;
  AddReduction(sync, report);
  return step_loss;
}

void PipelinePass::AddStageReport(const pipeline::StageStepReport& stage, StepSums& sums,
                                  StepReport& report) const {
  sums.step_seconds += stage.step_seconds;
  sums.forward_seconds += stage.forward_seconds;
  sums.backward_seconds += stage.backward_seconds;
  report.forward_seconds += stage.forward_seconds;
  report.backward_seconds += stage.backward_seconds;
  report.allreduce_wait_seconds += stage.allreduce_wait_seconds;
  PipelineStepFigures& figures = report.pipeline;
  figures.p2p_bytes += stage.bytes_sent + stage.bytes_received;
  figures.p2p_wait_seconds += stage.receive_wait_seconds + stage.send_seconds;
  figures.peak_activation_bytes =
      std::max(figures.peak_activation_bytes, stage.peak_activation_bytes);
}

// The stage's gradient allreduces over its replicas: one Reducer per chunk.
void PipelinePass::AddReduction(bool sync, StepReport& report) const {
  report.buckets = 0;
  for (const auto& ddp : chunk_ddps_) {
    const ddp::ReductionStats& reduction = ddp->last_reduction();
    report.allreduce_bytes += sync ? reduction.bytes : 0;
    report.allreduce_seconds += sync ? Seconds(reduction.allreduce) : 0;
    report.buckets += reduction.buckets;
  }
}

EvalResult PipelinePass::Evaluate(const std::vector<int64_t>& validation) {
  return EvaluatePipeline(context_, layout_, validation);
}

}  // namespace gradhub::trainer
