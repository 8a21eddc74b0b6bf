// Pipeline schedules as pure functions: which forwards and backwards one stage runs in one
// training step, and in what order. No torch, no communication: the stage runner
// (pipeline_stage.h) executes the list; tests/unit/ddp/pipeline_schedule_test.cc checks each
// rule and simulates all stages together.
//
// Terms. The model is cut into `stages` consecutive pieces, one per rank of a replica's
// pipeline; the batch into `micro_batches` equal micro-batches. With the interleaved schedule
// each stage holds `chunks_per_stage` (v) pieces instead of one: the model has stages * v
// virtual stages, and chunk c of stage s is virtual stage c * stages + s (Megatron-LM's
// layout: stage 0 holds virtual stages 0, S, 2S, ...), so an activation leaving the last
// stage's chunk c enters stage 0's chunk c + 1.
//
// Execution model the orders are built for: a stage runs its actions one at a time in list
// order; a forward first waits for its input from the previous virtual stage, a backward for
// the gradient of its output from the next one; sends never block (the runner waits for them
// at the end of the step). Under that model every schedule here completes for every shape it
// accepts: the test simulates all stages together for S in 1..8 and M in 1..16. Megatron-LM
// orders its blocking sends and receives by even and odd stage so that neighbours never both
// wait in a send; with asynchronous sends no such ordering is needed, only that each stage's
// list respects the dependencies, which the simulation checks.
//
// Thread-compatible: plain functions of their arguments.
#pragma once

#include <string>
#include <vector>

namespace gradhub::ddp::pipeline {

enum class PipelineSchedule {
  // GPipe (Huang et al. 2019): every micro-batch's forward, then every backward. Holds the
  // activations of all M micro-batches at once.
  kGPipe,
  // 1F1B (PipeDream-Flush; Narayanan et al. 2021, Megatron-LM): a warm-up of S - s - 1
  // forwards, then one forward and one backward in turn, then the remaining backwards. Same
  // bubble as GPipe, but stage s holds at most S - s micro-batches' activations.
  // Its steady state has no slack for messages: between sending micro-batch j's activation and
  // needing j's gradient back, stage s runs one forward and one backward per micro-batch it
  // leads stage s + 1 by (exactly one more than stage s + 1 leads s + 2), while the gradient
  // takes that much compute on the stages after it plus the messages there and back. So each
  // micro-batch waits for about a message's latency L (and for a neighbour's jitter): a step
  // takes about M (f + b + L) instead of M (f + b) (pipeline_schedule_test simulates it).
  // Negligible where L is microseconds against milliseconds of compute (NCCL); not over Gloo's
  // TCP and wake-ups (0.15 ms one way here): at S = 4, M = 16 and 15 ms a micro-batch the
  // bubble was 1.27 times the ideal with this order, 1.05 with the deep warm-up below
  // (tests/bench/pipeline/bubble.sh).
  kOneFOneB,
  // 1F1B with a deep warm-up: 2 (S - s - 1) forwards (the warm-up Megatron-LM's interleaved
  // schedule has per pair of neighbours), then as 1F1B. Stage s then leads s + 1 by one more
  // micro-batch, whose forward and backward cover the messages (up to f + b for both) and a
  // neighbour's jitter, so a step takes M (f + b) plus the latencies of the fill and drain
  // only. Costs activation memory: stage s holds up to min(2 (S - s) - 1, M)
  // micro-batches' (still fewer than GPipe's M for M > 2S - 1). The trainer uses it for 1F1B
  // on Gloo (CPU ranks), and Megatron-LM's on NCCL, where memory is what is short.
  kOneFOneBDeepWarmup,
  // Interleaved 1F1B (Narayanan et al. 2021, Megatron-LM's schedule with virtual pipeline
  // stages): v chunks per stage shrink the bubble to (S - 1) / (v * M + S - 1) at the cost of
  // v times the point-to-point messages. Needs M a multiple of S.
  kInterleavedOneFOneB,
};

// "GPIPE", "1F1B", "1F1B_DEEP_WARMUP", "INTERLEAVED_1F1B": for messages.
const char* PipelineScheduleName(PipelineSchedule schedule);

struct StageAction {
  enum class Kind { kForward, kBackward };
  Kind kind = Kind::kForward;
  int micro_batch = 0;
  int chunk = 0;  // which of the stage's pieces (always 0 unless interleaved)

  bool operator==(const StageAction& other) const {
    return kind == other.kind && micro_batch == other.micro_batch && chunk == other.chunk;
  }
  bool operator!=(const StageAction& other) const { return !(*this == other); }
};

// "F3" or "B3" (chunk 0), "F3.1" (chunk 1): for messages and test failures.
std::string ToString(const StageAction& action);

// Throws std::invalid_argument naming the first bad parameter: stages >= 1,
// micro_batches >= 1, chunks_per_stage >= 1; GPipe and 1F1B take exactly one chunk per stage;
// interleaved 1F1B needs chunks_per_stage >= 2 (with one it is 1F1B), stages >= 2 (one stage
// has no bubble to shrink) and micro_batches a multiple of stages (its rounds of S
// micro-batches, as Megatron-LM's).
//
// 1F1B does not need micro_batches >= stages: a stage whose warm-up (S - s - 1 forwards) would
// exceed M runs all M forwards and then all M backwards, which is GPipe on that stage. The
// step still completes; the bubble (S - 1) / (M + S - 1) is then at least one half.
void ValidatePipelineShape(PipelineSchedule schedule, int stages, int micro_batches,
                           int chunks_per_stage = 1);

// The actions stage `stage` (0 <= stage < stages) runs in one step, in order; every
// (micro-batch, chunk) appears once as a forward and once, later, as a backward. Throws as
// ValidatePipelineShape, and for a stage out of range.
//
// Backwards run in micro-batch order 0..M-1 in every schedule (GPipe included, as
// torch.distributed.pipelining's ScheduleGPipe): each parameter's gradient then sums the
// micro-batches in the same order whatever the schedule, so GPipe and 1F1B give bitwise equal
// gradients, and the last backward of a step is always micro-batch M - 1's (chunk 0's when
// interleaved), the one the runner lets data parallelism synchronize.
std::vector<StageAction> StageActions(PipelineSchedule schedule, int stages, int stage,
                                      int micro_batches, int chunks_per_stage = 1);

// The most (micro-batch, chunk) pairs whose forward ran and whose backward has not, at any
// point of the stage's step: how many micro-batches' activations it holds at once. M for
// GPipe, min(S - stage, M) for 1F1B, min(2 (S - stage) - 1, M) for its deep warm-up, counted
// from StageActions.
int PeakInFlightMicroBatches(PipelineSchedule schedule, int stages, int stage, int micro_batches,
                             int chunks_per_stage = 1);

// The fraction of a step each stage spends idle when every (virtual) stage's forward and
// backward take the same time and messages are free: (S - 1) / (v * M + S - 1). Throws as
// ValidatePipelineShape.
double IdealBubbleFraction(PipelineSchedule schedule, int stages, int micro_batches,
                           int chunks_per_stage = 1);

// Transfer order for backends that run a rank's transfers in issue order on one stream, where
// a send completes only once its peer's receive has started (NCCL; see
// nccl/nccl_process_group.h). Two neighbours must then issue the transfers between them in the
// same order. Stage s sends activations in forward order, the order stage s + 1 receives them
// in; the receives of the gradients coming back it posts ahead, each at the place where stage
// s + 1's list sends it. So, per micro-batch j: the micro-batches whose gradient receive stage
// s posts just before it sends j's activation (those whose backward comes after the previous
// forward and before forward j in stage s + 1's list). A gradient not listed (its backward
// follows stage s + 1's last forward) is received when its backward runs. Pairs of neighbours
// in this order never deadlock on such a stream: in a chain of stages, two neighbours whose
// next transfers are with each other always hold matching ones (the test simulates it).
// Megatron-LM gets the same from even and odd stages pairing each send with a receive.
//
// Empty lists on the last stage. GPipe: all empty (every backward follows every forward).
// Throws std::invalid_argument for the interleaved schedule, whose transfers go around the
// replica's ring: no such order is derived for it, so it runs on backends that take
// transfers in any order (Gloo).
std::vector<std::vector<int>> GradientReceivesAhead(PipelineSchedule schedule, int stages,
                                                    int stage, int micro_batches);

// Chunk `chunk` of stage `stage` is virtual stage chunk * stages + stage.
inline int VirtualStage(int stages, int stage, int chunk) { return chunk * stages + stage; }

}  // namespace gradhub::ddp::pipeline
