#include "gpu_worker/trainer/checkpointer.h"

#include <torch/torch.h>

#include <cstring>
#include <stdexcept>
#include <vector>

#include "gpu_worker/trainer/checkpoint_state.h"

namespace gradhub::trainer {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(std::chrono::nanoseconds duration) {
  return std::chrono::duration<double>(duration).count();
}

// Sends `bytes` from rank 0 to every rank (the others pass nullopt and get rank 0's value).
// nullopt everywhere when rank 0 has none. Two broadcasts: the length, then the bytes, padded
// to whole int64 elements because the process groups move typed tensors. They travel on
// `device` (an NCCL group moves only tensors on its GPU) and are read back on the CPU.
std::optional<std::string> BroadcastBytes(ddp::ProcessGroup& group,
                                          std::optional<std::string> bytes,
                                          const c10::Device& device) {
  at::Tensor length =
      torch::tensor({bytes ? static_cast<int64_t>(bytes->size()) : int64_t{-1}}).to(device);
  group.Broadcast({length}, 0)->Wait();
  const int64_t size = length.item<int64_t>();
  if (size < 0) return std::nullopt;
  at::Tensor payload = torch::zeros({(size + 7) / 8}, at::kLong);
  if (group.rank() == 0) std::memcpy(payload.data_ptr(), bytes->data(), bytes->size());
  payload = payload.to(device);
  group.Broadcast({payload}, 0)->Wait();
  payload = payload.cpu();
  return std::string(static_cast<const char*>(payload.data_ptr()), static_cast<size_t>(size));
}

// Every rank's `bytes`, in rank order, on every rank: lengths first, then the bytes padded to
// the longest (as int64 elements, which the process groups move), on `device` as above.
std::vector<std::string> AllGatherBytes(ddp::ProcessGroup& group, const std::string& bytes,
                                        const c10::Device& device) {
  const auto on_device = at::TensorOptions().dtype(at::kLong).device(device);
  std::vector<at::Tensor> lengths;
  for (int r = 0; r < group.size(); ++r) lengths.push_back(torch::empty({1}, on_device));
  group.AllGather(lengths, torch::tensor({static_cast<int64_t>(bytes.size())}).to(device))->Wait();
  int64_t longest = 1;
  for (at::Tensor& length : lengths) {
    length = length.cpu();
    longest = std::max(longest, length.item<int64_t>());
  }
  at::Tensor mine = torch::zeros({(longest + 7) / 8}, at::kLong);
  std::memcpy(mine.data_ptr(), bytes.data(), bytes.size());
  mine = mine.to(device);
  std::vector<at::Tensor> all;
  for (int r = 0; r < group.size(); ++r) all.push_back(torch::empty_like(mine));
  group.AllGather(all, mine)->Wait();
  for (at::Tensor& part : all) part = part.cpu();
  std::vector<std::string> result;
  for (int r = 0; r < group.size(); ++r) {
    result.emplace_back(static_cast<const char*>(all[r].data_ptr()),
                        static_cast<size_t>(lengths[r].item<int64_t>()));
  }
  return result;
}

}  // namespace

Checkpointer::Checkpointer(const TrainingPlan& plan, std::shared_ptr<CheckpointSink> sink,
                           std::ostream& log, std::shared_ptr<ddp::ProcessGroup> group,
                           const c10::Device& device, torch::nn::Module& module, UpdateRule& rule)
    : plan_(plan),
      sink_(plan.leader() ? std::move(sink) : nullptr),
      writer_(sink_ ? std::make_unique<AsyncCheckpointWriter>(sink_, &log) : nullptr),
      group_(std::move(group)),
      device_(device),
      module_(module),
      rule_(rule) {}

std::optional<Checkpointer::Resumed> Checkpointer::Load() {
  if (plan_.per_rank_state) {  // step 1
    at::Tensor saves = torch::tensor({int64_t{sink_ ? 1 : 0}}).to(device_);
    group_->Broadcast({saves}, 0)->Wait();
    rank0_saves_ = saves.item<int64_t>() != 0;
  }
  std::optional<std::string> bytes;  // step 2
  if (sink_) {
    if (std::optional<Checkpoint> latest = sink_->LoadLatest()) bytes = std::move(latest->bytes);
  }
  bytes = BroadcastBytes(*group_, std::move(bytes), device_);
  if (!bytes) return std::nullopt;
  Resumed resumed;  // step 3
  resumed.step = RestoreState(*bytes, module_, rule_.shared_state(), plan_.spec, plan_.rank,
                              &resumed.rank_state, device_);
  resumed_from_step_ = last_step_ = resumed.step;
  return resumed;
}

std::optional<double> Checkpointer::Save(int64_t step, bool stopping) {
  if (last_step_ == step) return std::nullopt;
  std::vector<std::string> rank_states;
  const auto start = Clock::now();
  if (plan_.per_rank_state) {  // step 1
    if (!rank0_saves_ || stopping) return std::nullopt;
    rank_states = AllGatherBytes(*group_, rule_.SaveRankState(), device_);
    last_step_ = step;
  }
  if (!writer_) return std::nullopt;
  std::string bytes = SerializeState(module_, rule_.shared_state(), step, plan_.spec, rank_states);
  totals_.snapshot_seconds += Seconds(Clock::now() - start);
  totals_.last_bytes = static_cast<int64_t>(bytes.size());
  totals_.wait_seconds += writer_->Submit({step, std::move(bytes)});
  last_step_ = step;
  ++totals_.saved;
  return Seconds(Clock::now() - start);
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
