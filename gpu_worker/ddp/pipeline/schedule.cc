#include "gpu_worker/ddp/pipeline/schedule.h"

#include <algorithm>
#include <stdexcept>

namespace gradhub::ddp::pipeline {
namespace {

using Kind = StageAction::Kind;

[[noreturn]] void Refuse(PipelineSchedule schedule, const std::string& what) {
  throw std::invalid_argument(std::string("pipeline schedule ") + PipelineScheduleName(schedule) +
                              ": " + what);
}

std::vector<StageAction> GPipe(int micro_batches) {
  std::vector<StageAction> actions;
  for (int mb = 0; mb < micro_batches; ++mb) actions.push_back({Kind::kForward, mb, 0});
  for (int mb = 0; mb < micro_batches; ++mb) actions.push_back({Kind::kBackward, mb, 0});
  return actions;
}

// Megatron-LM's forward_backward_pipelining_without_interleaving; `lead` 1, or 2 for the
// deep warm-up: stage s starts with lead * (S - s - 1) forwards.
std::vector<StageAction> OneFOneB(int stages, int stage, int micro_batches, int lead) {
  const int warmup = std::min(lead * (stages - stage - 1), micro_batches);
  std::vector<StageAction> actions;
  for (int mb = 0; mb < warmup; ++mb) actions.push_back({Kind::kForward, mb, 0});
  for (int i = 0; i + warmup < micro_batches; ++i) {
    actions.push_back({Kind::kForward, i + warmup, 0});
    actions.push_back({Kind::kBackward, i, 0});
  }
  for (int mb = micro_batches - warmup; mb < micro_batches; ++mb) {
    actions.push_back({Kind::kBackward, mb, 0});
  }
  return actions;
}

// The k-th forward or backward of interleaved 1F1B (Megatron-LM's get_model_chunk_id and
// get_microbatch_id_in_model_chunk): rounds of S micro-batches go through chunk 0, 1, ...,
// v - 1 (backwards: v - 1 down to 0) before the next round starts.
StageAction InterleavedAction(Kind kind, int k, int stages, int chunks) {
  const int round_length = stages * chunks;
  const int in_round = k % round_length;
  int chunk = in_round / stages;
  if (kind == Kind::kBackward) chunk = chunks - 1 - chunk;
  return {kind, (k / round_length) * stages + k % stages, chunk};
}

// Megatron-LM's forward_backward_pipelining_with_interleaving: a warm-up of
// 2 (S - s - 1) + (v - 1) S forwards, then one forward and one backward in turn.
std::vector<StageAction> InterleavedOneFOneB(int stages, int stage, int micro_batches, int chunks) {
  const int total = micro_batches * chunks;
  const int warmup = std::min(2 * (stages - stage - 1) + (chunks - 1) * stages, total);
  std::vector<StageAction> actions;
  for (int k = 0; k < warmup; ++k) {
    actions.push_back(InterleavedAction(Kind::kForward, k, stages, chunks));
  }
  for (int k = 0; k + warmup < total; ++k) {
    actions.push_back(InterleavedAction(Kind::kForward, k + warmup, stages, chunks));
    actions.push_back(InterleavedAction(Kind::kBackward, k, stages, chunks));
  }
  for (int k = total - warmup; k < total; ++k) {
    actions.push_back(InterleavedAction(Kind::kBackward, k, stages, chunks));
  }
  return actions;
}

}  // namespace

const char* PipelineScheduleName(PipelineSchedule schedule) {
  switch (schedule) {
    case PipelineSchedule::kGPipe:
      return "GPIPE";
    case PipelineSchedule::kOneFOneB:
      return "1F1B";
    case PipelineSchedule::kOneFOneBDeepWarmup:
      return "1F1B_DEEP_WARMUP";
    case PipelineSchedule::kInterleavedOneFOneB:
      return "INTERLEAVED_1F1B";
  }
  return "?";
}

std::string ToString(const StageAction& action) {
  std::string text = action.kind == Kind::kForward ? "F" : "B";
  text += std::to_string(action.micro_batch);
  if (action.chunk != 0) text += "." + std::to_string(action.chunk);
  return text;
}

void ValidatePipelineShape(PipelineSchedule schedule, int stages, int micro_batches,
                           int chunks_per_stage) {
  if (stages < 1) Refuse(schedule, "stages is " + std::to_string(stages) + "; it must be >= 1");
  if (micro_batches < 1) {
    Refuse(schedule, "micro_batches is " + std::to_string(micro_batches) + "; it must be >= 1");
  }
  const std::string chunks = "chunks_per_stage is " + std::to_string(chunks_per_stage);
  if (schedule != PipelineSchedule::kInterleavedOneFOneB) {
    if (chunks_per_stage != 1)
      Refuse(schedule, chunks + "; only INTERLEAVED_1F1B takes more than 1");
    return;
  }
  if (chunks_per_stage < 2) Refuse(schedule, chunks + "; it must be >= 2 (with 1 it is 1F1B)");
  if (stages < 2) {
    Refuse(schedule, "stages is " + std::to_string(stages) + "; interleaving needs >= 2");
  }
  if (micro_batches % stages != 0) {
    Refuse(schedule, "micro_batches is " + std::to_string(micro_batches) +
                         "; it must be a multiple of stages (" + std::to_string(stages) + ")");
  }
}

std::vector<StageAction> StageActions(PipelineSchedule schedule, int stages, int stage,
                                      int micro_batches, int chunks_per_stage) {
  ValidatePipelineShape(schedule, stages, micro_batches, chunks_per_stage);
  if (stage < 0 || stage >= stages) {
    Refuse(schedule, "stage is " + std::to_string(stage) + "; it must be in [0, " +
                         std::to_string(stages) + ")");
  }
  switch (schedule) {
    case PipelineSchedule::kGPipe:
      return GPipe(micro_batches);
    case PipelineSchedule::kOneFOneB:
      return OneFOneB(stages, stage, micro_batches, 1);
    case PipelineSchedule::kOneFOneBDeepWarmup:
      return OneFOneB(stages, stage, micro_batches, 2);
    case PipelineSchedule::kInterleavedOneFOneB:
      return InterleavedOneFOneB(stages, stage, micro_batches, chunks_per_stage);
  }
  Refuse(schedule, "unknown schedule");
}

int PeakInFlightMicroBatches(PipelineSchedule schedule, int stages, int stage, int micro_batches,
                             int chunks_per_stage) {
  int in_flight = 0, peak = 0;
  for (const StageAction& action :
       StageActions(schedule, stages, stage, micro_batches, chunks_per_stage)) {
    in_flight += action.kind == Kind::kForward ? 1 : -1;
    peak = std::max(peak, in_flight);
  }
  return peak;
}

std::vector<std::vector<int>> GradientReceivesAhead(PipelineSchedule schedule, int stages,
                                                    int stage, int micro_batches) {
  if (schedule == PipelineSchedule::kInterleavedOneFOneB) {
    Refuse(schedule, "no transfer order for one-stream backends (NCCL); use GPIPE or 1F1B");
  }
  StageActions(schedule, stages, stage, micro_batches);  // validates, the stage included
  std::vector<std::vector<int>> ahead(micro_batches);
  if (stage == stages - 1) return ahead;
  std::vector<int> since_last_forward;
  for (const StageAction& action : StageActions(schedule, stages, stage + 1, micro_batches)) {
    if (action.kind == Kind::kBackward) {
      since_last_forward.push_back(action.micro_batch);
    } else {
      ahead[action.micro_batch] = std::move(since_last_forward);
      since_last_forward.clear();
    }
  }
  return ahead;
}

double IdealBubbleFraction(PipelineSchedule schedule, int stages, int micro_batches,
                           int chunks_per_stage) {
  ValidatePipelineShape(schedule, stages, micro_batches, chunks_per_stage);
  return static_cast<double>(stages - 1) / (chunks_per_stage * micro_batches + stages - 1);
}

}  // namespace gradhub::ddp::pipeline
