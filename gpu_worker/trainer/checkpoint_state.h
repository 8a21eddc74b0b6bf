// What a checkpoint holds, and the rule for resuming with a spec that changed since it was
// written. Everything exact resume needs: weights and buffers, optimizer state (momentum,
// Adam moments), the step, and the part of the spec that decides the result. Data order and
// random numbers are functions of (seed, rank, step), so no generator state is stored.
#pragma once

#include <cstdint>
#include <string>

#include "gradhub/v1/jobs.pb.h"

namespace torch {
namespace nn {
class Module;
}
namespace optim {
class Optimizer;
}
}  // namespace torch

namespace gradhub::trainer {

// The spec with every field cleared that cannot change the parameters a run ends with, so two
// specs that differ only there resume each other's checkpoints. Harmless: displayName, labels,
// maxSteps and maxEpochs (training longer or shorter; except when a cosine schedule takes its
// period from maxSteps, which is then written in), evalEverySteps, logEverySteps, checkpoint,
// maxRestarts, hangTimeoutSeconds, priority, nodeSelector, distributed.ranksPerNode and
// dataset.prefetchBatches. Everything else (model, data, optimizer, schedule, batch, world
// size, backend, buckets, comm hook, precision, seed) decides the result.
v1::JobSpec ResumeRelevantSpec(const v1::JobSpec& spec_with_defaults);

// The archive's bytes (torch's zip format), a copy in host memory that training may run on
// from while it is uploaded.
std::string SerializeState(torch::nn::Module& module, torch::optim::Optimizer& optimizer,
                           int64_t step, const v1::JobSpec& spec_with_defaults);

// Loads the state into `module` and `optimizer` and returns its step. Throws UserError
// ("spec") naming the changed fields when the checkpoint was written under a spec whose
// ResumeRelevantSpec differs.
int64_t RestoreState(const std::string& bytes, torch::nn::Module& module,
                     torch::optim::Optimizer& optimizer, const v1::JobSpec& spec_with_defaults);

}  // namespace gradhub::trainer
