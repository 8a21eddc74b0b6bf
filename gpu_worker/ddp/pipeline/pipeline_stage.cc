#include "gpu_worker/ddp/pipeline/pipeline_stage.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <string>
#include <utility>

#include "gpu_worker/ddp/pipeline/allocation_counter.h"

namespace gradhub::ddp::pipeline {
namespace {

using Clock = std::chrono::steady_clock;
using Kind = StageAction::Kind;

double Seconds(std::chrono::nanoseconds duration) {
  return std::chrono::duration<double>(duration).count();
}

[[noreturn]] void Refuse(const std::string& what) {
  throw std::invalid_argument("pipeline stage: " + what);
}

std::vector<StageAction> CheckedActions(const std::shared_ptr<ProcessGroup>& group,
                                        const PipelineLayout& layout,
                                        const PipelineStageOptions& options) {
  if (!group) Refuse("the process group is null");
  if (group->size() != layout.world_size()) {
    Refuse("the process group has " + std::to_string(group->size()) + " ranks, the layout " +
           std::to_string(layout.stages()) + " stages x " + std::to_string(layout.replicas()) +
           " replicas");
  }
  std::vector<StageAction> actions =
      StageActions(options.schedule, layout.stages(), layout.StageOf(group->rank()),
                   options.micro_batches, options.chunks_per_stage);
  // Every tag of the step must fit (stage_autograd.h): the last boundary, the last micro-batch.
  MessageTag(MessageKind::kLoss, layout.stages() * options.chunks_per_stage - 1,
             options.micro_batches - 1);
  return actions;
}

std::vector<bool> LastBackwardOfChunk(const std::vector<StageAction>& actions) {
  std::vector<bool> last(actions.size(), false);
  std::vector<bool> seen;
  for (size_t i = actions.size(); i-- > 0;) {
    const StageAction& action = actions[i];
    if (action.kind != Kind::kBackward) continue;
    if (seen.size() <= static_cast<size_t>(action.chunk)) seen.resize(action.chunk + 1, false);
    last[i] = !seen[action.chunk];
    seen[action.chunk] = true;
  }
  return last;
}

std::vector<std::vector<int>> GradientsAhead(const PipelineStageOptions& options,
                                             const PipelineLayout& layout, int stage) {
  if (options.chunks_per_stage > 1) return std::vector<std::vector<int>>(options.micro_batches);
  return GradientReceivesAhead(options.schedule, layout.stages(), stage, options.micro_batches);
}

// The batch's micro-batches (views). `what` names the tensor in errors.
std::vector<at::Tensor> SplitMicroBatches(const at::Tensor& batch, int micro_batches,
                                          const std::string& what) {
  if (!batch.defined() || batch.dim() < 1) Refuse("this stage needs the batch's " + what);
  const int64_t rows = batch.size(0);
  if (rows == 0 || rows % micro_batches != 0) {
    throw std::invalid_argument("parallelism.microBatches is " + std::to_string(micro_batches) +
                                "; it must split the batch of " + std::to_string(rows) +
                                " samples into equal micro-batches");
  }
  return batch.split(rows / micro_batches);
}

// What one action spent communicating, from the traffic's totals before and after it.
std::chrono::nanoseconds Communication(const StageTraffic::Totals& before,
                                       const StageTraffic::Totals& after) {
  return (after.send - before.send) + (after.receive_wait - before.receive_wait);
}

}  // namespace

// The state of one Step: micro-batches, in-flight terminals, measurements.
class PipelineStage::StepRun {
 public:
  StepRun(const PipelineStage& stage, const StepBatch& batch, const StepControl& control)
      : stage_(stage), control_(control), start_totals_(stage.traffic_->totals()) {
    const int m = stage.options_.micro_batches;
    if (stage.is_first()) inputs_ = SplitMicroBatches(batch.inputs, m, "inputs");
    if (stage.is_last()) {
      targets_ = SplitMicroBatches(batch.targets, m, "targets");
      batch_rows_ = batch.targets.size(0);
    }
    in_flight_.resize(static_cast<size_t>(m) * stage.options_.chunks_per_stage);
  }

  StageStepReport Run() {
    const auto start = Clock::now();
    const auto& actions = stage_.actions_;
    for (size_t i = 0; i < actions.size(); ++i) {
      const auto before = stage_.traffic_->totals();
      const auto action_start = Clock::now();
      if (actions[i].kind == Kind::kForward) {
        Forward(actions[i]);
        times_.forward += Clock::now() - action_start;
      } else {
        Backward(actions[i], control_.sync_gradients && stage_.last_backward_of_chunk_[i]);
        times_.backward += Clock::now() - action_start;
      }
      auto& phase = actions[i].kind == Kind::kForward ? times_.forward : times_.backward;
      phase -= Communication(before, stage_.traffic_->totals());
      stage_.traffic_->ReleaseCompletedSends();
    }
    stage_.traffic_->WaitForSends();
    ExchangeLoss();
    return Report(Clock::now() - start);
  }

 private:
  struct InFlight {
    at::Tensor terminal;
    int64_t bytes = 0;  // what its forward left allocated, its input's buffer included
  };
  // What in-flight micro-batches hold, and the most they held.
  struct Held {
    int64_t bytes = 0, peak_bytes = 0;
    int count = 0, peak_count = 0;

    void Add(int64_t forward_bytes) {
      bytes += forward_bytes;
      peak_bytes = std::max(peak_bytes, bytes);
      peak_count = std::max(peak_count, ++count);
    }
    void Release(int64_t forward_bytes) {
      bytes -= forward_bytes;
      --count;
    }
  };
  struct Times {
    std::chrono::nanoseconds forward{0}, backward{0}, allreduce_wait{0};
  };

  int virtual_stages() const { return stage_.layout_.stages() * stage_.options_.chunks_per_stage; }
  Crossing CrossingTo(int peer, int boundary, int micro_batch) const {
    return Crossing{stage_.traffic_, peer, boundary, micro_batch};
  }
  InFlight& Slot(const StageAction& action) {
    return in_flight_[static_cast<size_t>(action.micro_batch) * stage_.options_.chunks_per_stage +
                      action.chunk];
  }

  void Forward(const StageAction& action) {
    const int rank = stage_.group_->rank();
    const int at = VirtualStage(stage_.layout_.stages(), stage_.stage(), action.chunk);
    int64_t allocated_before = memory_.net_bytes();
    at::Tensor input = at == 0 ? inputs_[action.micro_batch]
                               : ReceiveActivation(CrossingTo(stage_.layout_.PreviousRank(rank),
                                                              at - 1, action.micro_batch));
    at::Tensor output = ChunkForward(action.chunk, input);
    InFlight& slot = Slot(action);
    if (at == virtual_stages() - 1) {
      slot.terminal = LossTerminal(action.micro_batch, output);
    } else {
      allocated_before += PostGradientsAhead(action.micro_batch);
      slot.terminal =
          SendActivation(output, CrossingTo(stage_.layout_.NextRank(rank), at, action.micro_batch));
    }
    slot.bytes += memory_.net_bytes() - allocated_before;
    held_.Add(slot.bytes);
    if (stage_.group_->TransfersInAnyOrder() && at > 0 &&
        action.micro_batch + 1 < stage_.options_.micro_batches) {
      PostNextInput(action, at);
    }
  }

  // Posts the receive of the next micro-batch's input across the same boundary (the next
  // forward of this chunk), so that it lands while this stage computes. Its buffer counts as
  // held by that micro-batch. Only where transfers may come in any order: on one stream
  // (NCCL) it would block this stage's gradient sends to the previous stage, which that stage
  // waits for before it sends the activation (pipeline_schedule_test simulates it).
  void PostNextInput(const StageAction& action, int at) {
    const int64_t before = memory_.net_bytes();
    PostActivationReceive(CrossingTo(stage_.layout_.PreviousRank(stage_.group_->rank()), at - 1,
                                     action.micro_batch + 1));
    Slot({Kind::kForward, action.micro_batch + 1, action.chunk}).bytes =
        memory_.net_bytes() - before;
  }

  // Posts the gradient receives due before `micro_batch`'s activation is sent. Their buffers
  // count as held by the micro-batches they are for. Returns the bytes they took.
  int64_t PostGradientsAhead(int micro_batch) {
    int64_t total = 0;
    for (int earlier : stage_.gradients_ahead_[micro_batch]) {
      InFlight& slot = in_flight_[earlier];  // one chunk per stage: the index is the micro-batch
      const int64_t before = memory_.net_bytes();
      PostGradientReceive(slot.terminal);
      const int64_t buffer = memory_.net_bytes() - before;
      slot.bytes += buffer;
      held_.bytes += buffer;
      total += buffer;
    }
    return total;
  }

  at::Tensor ChunkForward(int chunk, const at::Tensor& input) {
    const StageChunk& piece = stage_.chunks_[chunk];
    if (piece.ddp == nullptr) return piece.forward(input);
    // Buffers are synchronized as DDP does for every micro-batch; nothing is armed here.
    auto no_sync = piece.ddp->NoSync();
    return piece.ddp->Forward([&] { return piece.forward(input); });
  }

  // The last virtual stage's terminal: the micro-batch's loss, weighted by its share of the
  // batch, so that the micro-batches' gradients sum to those of the batch's mean loss.
  at::Tensor LossTerminal(int micro_batch, const at::Tensor& output) {
    const at::Tensor& target = targets_[micro_batch];
    at::Tensor loss = stage_.loss_(output, target);
    if (loss.numel() != 1) {
      Refuse("the loss function returned " + std::to_string(loss.numel()) +
             " elements; it must return the micro-batch's mean loss");
    }
    const double weight = static_cast<double>(target.size(0)) / static_cast<double>(batch_rows_);
    const at::Tensor part = loss.detach().to(at::kDouble).reshape({}) * weight;
    loss_ = loss_.defined() ? loss_ + part : part;
    at::Tensor scaled = loss.reshape({}) * weight;
    return control_.loss_for_backward ? control_.loss_for_backward(scaled) : scaled;
  }

  void Backward(const StageAction& action, bool synchronize) {
    InFlight& slot = Slot(action);
    at::Tensor terminal = std::move(slot.terminal);
    DistributedDataParallel* ddp = stage_.chunks_[action.chunk].ddp;
    if (synchronize && ddp != nullptr) {
      // DDP arms its Reducer in Forward (PyTorch's prepare_for_backward). This micro-batch's
      // forward ran long ago, and other micro-batches' backwards, which an armed Reducer must
      // not see, ran since; so its terminal goes through Forward just before its backward.
      ddp->Forward([&] { return terminal; });
      ddp->Backward(terminal);
      times_.allreduce_wait += ddp->last_timings().allreduce_wait;
      times_.backward -= ddp->last_timings().allreduce_wait;
    } else {
      terminal.backward();
    }
    held_.Release(slot.bytes);
    slot.bytes = 0;
  }

  // The last stage sends the step's loss to stage 0 of its replica (see the header, step 3).
  void ExchangeLoss() {
    const PipelineLayout& layout = stage_.layout_;
    if (layout.stages() == 1) return;
    const int rank = stage_.group_->rank();
    const uint32_t tag = MessageTag(MessageKind::kLoss, 0, 0);
    if (stage_.is_last()) {
      stage_.traffic_->Send(loss_.contiguous(), layout.FirstStageRank(rank), tag);
    } else if (stage_.is_first()) {
      loss_ = at::empty({}, at::TensorOptions().dtype(at::kDouble).device(stage_.options_.device));
      stage_.traffic_->Receive(loss_, layout.LastStageRank(rank), tag);
    }
  }

  StageStepReport Report(std::chrono::nanoseconds step) const {
    const StageTraffic::Totals end = stage_.traffic_->totals();
    StageStepReport report;
    report.loss = loss_;
    report.step_seconds = Seconds(step);
    report.forward_seconds = Seconds(times_.forward);
    report.backward_seconds = Seconds(times_.backward);
    report.allreduce_wait_seconds = Seconds(times_.allreduce_wait);
    report.send_seconds = Seconds(end.send - start_totals_.send);
    report.receive_wait_seconds = Seconds(end.receive_wait - start_totals_.receive_wait);
    report.bytes_sent = end.bytes_sent - start_totals_.bytes_sent;
    report.bytes_received = end.bytes_received - start_totals_.bytes_received;
    const double computing = report.forward_seconds + report.backward_seconds;
    report.bubble_fraction =
        step.count() > 0 ? std::max(0.0, 1 - computing / report.step_seconds) : 0;
    report.peak_activation_bytes = memory_.active() ? held_.peak_bytes : -1;
    report.peak_in_flight = held_.peak_count;
    return report;
  }

  const PipelineStage& stage_;
  const StepControl& control_;
  const StageTraffic::Totals start_totals_;
  AllocationCounter memory_;  // counts this thread's allocations during the step
  std::vector<at::Tensor> inputs_, targets_;
  int64_t batch_rows_ = 0;
  std::vector<InFlight> in_flight_;  // by micro_batch * chunks_per_stage + chunk
  Held held_;
  Times times_;
  at::Tensor loss_;  // the step's, float64: the sum of the weighted micro-batch losses
};

PipelineStage::PipelineStage(std::shared_ptr<ProcessGroup> group, const PipelineLayout& layout,
                             PipelineStageOptions options, std::vector<StageChunk> chunks,
                             LossFunction loss)
    : group_(std::move(group)),
      layout_(layout),
      options_(std::move(options)),
      chunks_(std::move(chunks)),
      loss_(std::move(loss)),
      actions_(CheckedActions(group_, layout_, options_)),
      last_backward_of_chunk_(LastBackwardOfChunk(actions_)),
      gradients_ahead_(GradientsAhead(options_, layout_, stage())),
      traffic_(std::make_shared<StageTraffic>(group_, options_.device)) {
  if (chunks_.size() != static_cast<size_t>(options_.chunks_per_stage)) {
    Refuse(std::to_string(chunks_.size()) + " chunks given for chunks_per_stage " +
           std::to_string(options_.chunks_per_stage));
  }
  for (size_t c = 0; c < chunks_.size(); ++c) {
    const std::string chunk = "chunk " + std::to_string(c);
    if (!chunks_[c].forward) Refuse(chunk + " has no forward");
    if (chunks_[c].ddp == nullptr && layout_.replicas() > 1) {
      Refuse(chunk + " has no DistributedDataParallel, but its stage has " +
             std::to_string(layout_.replicas()) + " replicas whose gradients must be averaged");
    }
    if (chunks_[c].ddp != nullptr && chunks_[c].ddp->group().size() != layout_.replicas()) {
      Refuse(chunk + "'s DistributedDataParallel spans " +
             std::to_string(chunks_[c].ddp->group().size()) + " ranks, not the stage's " +
             std::to_string(layout_.replicas()) + " replicas");
    }
  }
  if (is_last() && !loss_) Refuse("the last stage needs a loss function");
}

PipelineStage::~PipelineStage() = default;

StageStepReport PipelineStage::Step(const StepBatch& batch, const StepControl& control) {
  return StepRun(*this, batch, control).Run();
}

}  // namespace gradhub::ddp::pipeline
