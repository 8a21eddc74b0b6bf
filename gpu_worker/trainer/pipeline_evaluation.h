// Evaluation of a pipelined model: forward only, through the stages, over the validation split.
//
// On every rank (a collective of the world group):
//   1. Replica d takes every replicas-th validation example from the d-th, in batches of
//      batchSizePerRank; all its stages go through the same batches (the first needs their
//      inputs, the last their targets; the others only count them).
//   2. Per batch, each of the rank's chunks in order (virtual stage c x stages + stage): its
//      input is the batch (virtual stage 0) or received from the previous virtual stage (a
//      shape header, then the values), its output goes to the next virtual stage, or, on the
//      last, into the sums of loss, correct predictions and items. Sends are asynchronous, so
//      the stages work on successive batches at once, as a pipeline's forwards do; no
//      autograd graph is kept.
//   3. The sums are added over the world group (the ranks of other stages add zeros): every
//      rank reports the same metrics.
// Messages use the activation tags of the pipeline (stage_autograd.h) at a micro-batch index no
// step uses (the last one there is), and run between steps, so they never meet a step's.
// Not thread-safe: the training thread drives it.
#pragma once

#include <cstdint>
#include <vector>

#include "gpu_worker/ddp/pipeline/layout.h"
#include "gpu_worker/trainer/data_parallel_pass.h"

namespace gradhub::trainer {

// Leaves the rank's chunks in training mode.
EvalResult EvaluatePipeline(const PassContext& context, const ddp::pipeline::PipelineLayout& layout,
                            const std::vector<int64_t>& validation);

}  // namespace gradhub::trainer
