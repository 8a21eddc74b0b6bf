#include "gpu_worker/trainer/checkpointer.h"

#include <torch/torch.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "gpu_worker/trainer/checkpoint_state.h"
#include "gpu_worker/trainer/checkpoint_transfer.h"
#include "gpu_worker/trainer/pipeline_checkpoint_format.h"
#include "services/common/contract/user_error.h"

namespace gradhub::trainer {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(std::chrono::nanoseconds duration) {
  return std::chrono::duration<double>(duration).count();
}

// The bytes to broadcast, or nullopt.
template <typename Bytes>
std::optional<std::string_view> ViewOf(const std::optional<Bytes>& bytes) {
  if (!bytes) return std::nullopt;
  return std::string_view(*bytes);
}

// What ReceiveBytes hands over, appended to `file`.
std::function<void(std::string_view)> AppendingTo(ScratchFile& file) {
  return [&file](std::string_view chunk) { file.Append(chunk); };
}

// The header a pipeline's rank 0 broadcasts at resume: the step, a newline, the spec.
std::string PipelineHeader(const PipelineState& state) {
  return std::to_string(state.step) + "\n" + state.spec;
}

}  // namespace

const std::optional<CheckpointBytes>& LatestCheckpoint::Peek() {
  if (!fetched_ && sink_) {
    std::optional<Checkpoint> latest = sink_->LoadLatest();
    if (latest) bytes_ = std::move(latest->bytes);
  }
  fetched_ = true;
  return bytes_;
}

std::optional<CheckpointBytes> LatestCheckpoint::Take() {
  Peek();
  std::optional<CheckpointBytes> bytes = std::move(bytes_);
  bytes_.reset();
  return bytes;
}

std::vector<double> RecordedLayerCosts(const TrainingPlan& plan, LatestCheckpoint& latest) {
  if (!plan.pipeline.enabled() || plan.pipeline.balance != v1::ParallelismSpec::MEASURED_TIME ||
      !plan.leader()) {
    return {};
  }
  const std::optional<CheckpointBytes>& bytes = latest.Peek();
  if (!bytes) return {};
  return ReadPipelineLayerCosts(*bytes);
}

Checkpointer::Checkpointer(const TrainingPlan& plan, std::shared_ptr<CheckpointSink> sink,
                           LatestCheckpoint& latest, std::ostream& log,
                           std::shared_ptr<ddp::ProcessGroup> group, const c10::Device& device,
                           const RankModel& model, UpdateRule& rule, std::string scratch_dir)
    : plan_(plan),
      sink_(plan.leader() ? std::move(sink) : nullptr),
      latest_(latest),
      writer_(sink_ ? std::make_unique<AsyncCheckpointWriter>(sink_, &log) : nullptr),
      group_(std::move(group)),
      device_(device),
      module_(*model.module),
      layer_costs_(model.layer_costs),
      rule_(rule),
      scratch_dir_(std::move(scratch_dir)) {}

std::optional<Checkpointer::Resumed> Checkpointer::Load() {
  if (plan_.collective_checkpoint()) {  // step 1
    at::Tensor saves = torch::tensor({int64_t{sink_ ? 1 : 0}}).to(device_);
    group_->Broadcast({saves}, 0)->Wait();
    rank0_saves_ = saves.item<int64_t>() != 0;
  }
  std::optional<Resumed> resumed = plan_.pipeline.enabled() ? LoadStages() : LoadReplicated();
  if (resumed) resumed_from_step_ = last_step_ = resumed->step;
  return resumed;
}

std::optional<Checkpointer::Resumed> Checkpointer::LoadReplicated() {
  const std::optional<CheckpointBytes> latest = sink_ ? latest_.Take() : std::nullopt;
  const std::optional<std::string> bytes = BroadcastBytes(*group_, ViewOf(latest), device_);
  if (!bytes) return std::nullopt;  // step 2
  Resumed resumed;                  // step 3
  resumed.step = RestoreState(*bytes, module_, rule_.shared_state(), plan_.spec, plan_.rank,
                              &resumed.rank_state, device_);
  return resumed;
}

std::optional<Checkpointer::Resumed> Checkpointer::LoadStages() {
  const int stages = plan_.pipeline.stages;
  std::optional<PipelineState> state;  // rank 0's
  std::optional<std::string> header;
  if (std::optional<CheckpointBytes> bytes = sink_ ? latest_.Take() : std::nullopt) {
    state = ReadPipelineState(*bytes);
    header = PipelineHeader(*state);
  }
  header = BroadcastBytes(*group_, ViewOf(header), device_);
  if (!header) return std::nullopt;
  const size_t newline = header->find('\n');
  const std::string saved_spec = header->substr(newline + 1);
  if (!saved_spec.empty()) RequireSameSpec(saved_spec, plan_.spec);  // on every rank alike
  CheckpointBytes mine;
  if (state) {
    if (state->stage_states.size() != static_cast<size_t>(stages)) {
      throw UserError("checkpoint",
                      "holds the state of " + std::to_string(state->stage_states.size()) +
                          " pipeline stages, not the job's " + std::to_string(stages));
    }
    for (int rank = 1; rank < plan_.world_size; ++rank) {
      SendBytes(*group_, state->stage_states[static_cast<size_t>(rank % stages)].view(), rank,
                device_);
    }
    mine = std::move(state->stage_states.front());
  } else {
    mine = ReceiveStageState();
  }
  RestoreRankState(mine.view(), StageParts(), device_);
  return Resumed{std::stoll(header->substr(0, newline)), ""};
}

RankStateParts Checkpointer::StageParts() {
  RankStateParts parts;
  parts.module = &module_;
  parts.optimizer = rule_.shared_state().optimizer;
  return parts;
}

SaveReport Checkpointer::Save(int64_t step, SaveReason reason) {
  if (last_step_ == step) return {};
  const bool collective = plan_.collective_checkpoint();
  if (collective && (!rank0_saves_ || reason == SaveReason::kStop)) return {};
  const auto start = Clock::now();
  // The skip rule, on rank 0, before anything is serialized.
  const std::optional<InFlightSave> in_flight = writer_ ? writer_->in_flight() : std::nullopt;
  const SaveUrgency urgency =
      reason == SaveReason::kPeriodic ? SaveUrgency::kSkippable : SaveUrgency::kMustSave;
  const bool skip = SkipCheckpoint(urgency, in_flight);
  std::optional<CheckpointBytes> bytes;
  if (!skip || collective) bytes = Snapshot(step, /*keep=*/!skip);  // step 1
  if (collective) last_step_ = step;
  if (skip) {  // without a collective last_step_ stays: a stop at this step still saves it
    ++totals_.skipped;
    return SaveReport{std::nullopt, in_flight};
  }
  if (!writer_ || !bytes) return {};
  totals_.snapshot_seconds += Seconds(Clock::now() - start);  // step 2
  totals_.last_bytes = static_cast<int64_t>(bytes->size());
  totals_.wait_seconds += writer_->Submit({step, std::move(*bytes)});
  last_step_ = step;
  ++totals_.saved;
  return SaveReport{Seconds(Clock::now() - start), std::nullopt};
}

int64_t Checkpointer::last_saved_step() const {
  const int64_t submitted = writer_ ? writer_->last_submitted_step() : -1;
  return std::max(submitted, resumed_from_step_);
}

std::optional<CheckpointBytes> Checkpointer::Snapshot(int64_t step, bool keep) {
  if (plan_.pipeline.enabled()) return GatherStages(step);
  std::vector<std::string> rank_states;
  if (plan_.per_rank_state) rank_states = AllGatherBytes(*group_, rule_.SaveRankState(), device_);
  if (!writer_ || !keep) return std::nullopt;
  // Into the previous snapshot's memory once its upload is done with it (checkpointer.h).
  std::string memory = CheckpointBytes::Reclaim(std::move(previous_snapshot_));
  CheckpointBytes bytes = SerializeState(module_, rule_.shared_state(), step, plan_.spec,
                                         rank_states, std::move(memory));
  previous_snapshot_ = bytes;
  return bytes;
}

CheckpointBytes Checkpointer::WriteStageState() {
  ScratchFile file(scratch_dir_);
  WriteRankState(StageParts(), file);
  return file.Map();
}

CheckpointBytes Checkpointer::ReceiveStageState() {
  ScratchFile file(scratch_dir_);
  ReceiveBytes(*group_, 0, device_, AppendingTo(file));
  return file.Map();
}

// Save step 1 with pipeline stages, on the stages' replica-0 ranks:
//   a. a stage other than 0 writes its stage's state to a scratch file (WriteStageState) and
//      streams it to rank 0 (SendBytes);
//   b. rank 0 writes the checkpoint into one scratch file: the index, with the stages' sizes
//      left 0, then its own stage's state, written there directly, then each other stage's as
//      its chunks arrive;
//   c. rank 0 writes the index again, now with the sizes (the same length: they are fixed-size
//      fields), and maps the file for the writer to upload.
std::optional<CheckpointBytes> Checkpointer::GatherStages(int64_t step) {
  const PipelinePlan& pipeline = plan_.pipeline;
  if (pipeline.replica != 0) return std::nullopt;
  if (plan_.rank != 0) {
    SendBytes(*group_, WriteStageState().view(), 0, device_);  // a
    return std::nullopt;
  }
  const std::string spec = ResumeRelevantSpec(plan_.spec).SerializeAsString();  // b
  std::vector<int64_t> sizes(static_cast<size_t>(pipeline.stages), 0);
  ScratchFile checkpoint(scratch_dir_);
  checkpoint.Append(PipelineCheckpointIndex(step, spec, layer_costs_, sizes));
  const int64_t start = checkpoint.size();
  WriteRankState(StageParts(), checkpoint);
  sizes[0] = checkpoint.size() - start;
  for (int stage = 1; stage < pipeline.stages; ++stage) {
    sizes[static_cast<size_t>(stage)] =
        ReceiveBytes(*group_, stage, device_, AppendingTo(checkpoint));
  }
  checkpoint.Overwrite(0, PipelineCheckpointIndex(step, spec, layer_costs_, sizes));  // c
  return checkpoint.Map();
}

void Checkpointer::Flush(std::chrono::milliseconds timeout) {
  if (!writer_) return;
  std::optional<SaveOutcome> outcome = writer_->Flush(timeout);
  if (!outcome) {
    throw std::runtime_error("checkpoint of step " +
                             std::to_string(writer_->last_submitted_step()) +
                             " not committed within " + std::to_string(timeout.count()) + " ms");
  }
  if (!outcome->error.empty()) {
    throw std::runtime_error("checkpoint of step " + std::to_string(outcome->step) +
                             " failed: " + outcome->error);
  }
}

}  // namespace gradhub::trainer
