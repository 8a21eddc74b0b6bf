#include "gpu_worker/trainer/trainer.h"

#include <dlfcn.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <limits>
#include <optional>
#include <thread>

#include "gpu_worker/data/batch_loader.h"
#include "gpu_worker/data/dataset.h"
#include "gpu_worker/data/sampler.h"
#include "gpu_worker/ddp/distributed_data_parallel.h"
#include "gpu_worker/ddp/mixed_precision.h"
#include "gpu_worker/ddp/model_averager.h"
#include "gpu_worker/ddp/zero_redundancy_optimizer.h"
#include "gpu_worker/models/model.h"
#include "gpu_worker/trainer/async_checkpoint_writer.h"
#include "gpu_worker/trainer/checkpoint_state.h"
#include "gpu_worker/trainer/optimization.h"
#include "services/common/contract/job_spec.h"
#include "services/common/contract/progress_record.h"
#include "services/common/contract/user_error.h"
#include "services/common/sha256.h"

namespace gradhub::trainer {
namespace {

// at::set_num_threads does not reach OpenBLAS's own thread pool (Debian's libtorch links the
// pthreads build), so ranks sharing a machine would each run a BLAS thread per core and spin
// against each other in sched_yield. Set it too, when OpenBLAS is the BLAS in this process.
void LimitBlasThreads(int threads) {
  using SetThreads = void (*)(int);
  if (auto set = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) {
    set(threads);
  }
}

using Clock = std::chrono::steady_clock;

double Seconds(std::chrono::nanoseconds duration) {
  return std::chrono::duration<double>(duration).count();
}

// The generator is reseeded every step from (seed, rank, step): dropout masks differ between
// ranks and steps, yet a run resumed at step s draws exactly what the uninterrupted run drew,
// with no generator state in the checkpoint.
uint64_t StepSeed(uint64_t seed, int rank, int64_t step) {
  uint64_t x = seed ^ (0x9e3779b97f4a7c15ULL * (static_cast<uint64_t>(rank) + 1)) ^
               (0xbf58476d1ce4e5b9ULL * static_cast<uint64_t>(step + 1));
  x ^= x >> 31;  // splitmix64 finalizer: nearby inputs give unrelated seeds
  x *= 0x94d049bb133111ebULL;
  return x ^ (x >> 29);
}

at::Tensor Loss(Task task, const at::Tensor& output, const at::Tensor& target) {
  switch (task) {
    case Task::kClassification:
      return torch::cross_entropy_loss(output, target);
    case Task::kRegression:
      return torch::mse_loss(output.reshape({-1}), target.reshape({-1}).to(output.scalar_type()));
    case Task::kLanguageModel:
      return torch::cross_entropy_loss(output.reshape({-1, output.size(-1)}), target.reshape({-1}));
  }
  return {};
}

std::string ParametersSha256(torch::nn::Module& module) {
  std::string bytes;
  for (const at::Tensor& parameter : module.parameters()) {
    at::Tensor cpu = parameter.detach().to(at::kCPU).contiguous();
    bytes.append(static_cast<const char*>(cpu.data_ptr()), cpu.numel() * cpu.element_size());
  }
  return Sha256Hex(bytes);
}

// Where one rank trains and how it reduces, from the spec's backend and what the agent said
// (TrainerOptions::device and ::backend).
struct Placement {
  // Of the model, its optimizer state, the batches and every tensor a collective moves.
  c10::Device device = c10::kCPU;
  ddp::Backend backend = ddp::Backend::kGloo;
  bool cuda() const { return device.is_cuda(); }
};

Placement ResolvePlacement(const v1::JobSpec& spec, const TrainerOptions& options) {
  using Spec = v1::DistributedSpec;
  const bool gpu = options.device == DeviceKind::kCuda;
  Spec::Backend backend = spec.distributed().backend();
  if (backend == Spec::AUTO) backend = options.backend;
  if (backend == Spec::AUTO) backend = gpu ? Spec::NCCL : Spec::GLOO;
  Placement placement;
  if (backend == Spec::GLOO) return placement;  // Gloo reduces CPU tensors: train on the CPU
  if (!gpu) {
    throw UserError("distributed.backend",
                    "NCCL needs a GPU node; this rank runs on a CPU node (GRADHUB_DEVICE=cpu): "
                    "use AUTO or GLOO there, or a nodeSelector that picks GPU nodes");
  }
  if (!torch::cuda::is_available()) {
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    throw DeviceUnavailable(
        std::string("this rank was given a GPU (GRADHUB_DEVICE=cuda, CUDA_VISIBLE_DEVICES=") +
        (visible ? visible : "unset") +
        ") but can use none: a libtorch without CUDA, no NVIDIA driver, or no such device");
  }
  placement.backend = ddp::Backend::kNccl;
  // cuda:0 under the agent (CUDA_VISIBLE_DEVICES shows the rank its GPU alone); by hand on a
  // machine with several, the local rank's, as torchrun does.
  const int64_t visible = static_cast<int64_t>(torch::cuda::device_count());
  placement.device =
      c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(options.local_rank % visible));
  return placement;
}

// A batch onto the training device. From pinned memory (BatchLoader's pin_memory) the copy is
// asynchronous: queued on the stream ahead of the step's kernels, with no wait on the host.
at::Tensor ToDevice(const at::Tensor& tensor, const c10::Device& device) {
  return device.is_cpu() ? tensor : tensor.to(device, /*non_blocking=*/true);
}

// torch::nn::utils::clip_grad_norm_ returns the total norm as a double, which waits for the
// GPU at every step; this scales the gradients by the same clamp(max_norm / (norm + 1e-6), 1)
// without reading anything back. The CPU keeps torch's.
void ClipGradNormOnDevice(const std::vector<at::Tensor>& parameters, double max_norm) {
  torch::NoGradGuard no_grad;
  std::vector<at::Tensor> norms;
  for (const at::Tensor& p : parameters) {
    if (p.grad().defined()) norms.push_back(p.grad().norm(2));
  }
  if (norms.empty()) return;
  const at::Tensor coefficient =
      torch::clamp_max(max_norm / (torch::stack(norms).norm(2) + 1e-6), 1.0);
  for (const at::Tensor& p : parameters) {
    if (p.grad().defined()) p.grad().mul_(coefficient);
  }
}

struct EvalResult {
  double loss = 0;
  std::map<std::string, double> metrics;
};

// Forward and loss in its scope run under autocast to bfloat16 when the spec asks for BF16,
// and to float16 for FP16 on a GPU; nothing changes otherwise. (FP16 on the CPU runs only
// under TrainerOptions::fp16_scaling_on_cpu_for_test, without autocast: the CPU's has no
// float16.) `device`: the training device's type, whose autocast is turned on.
class PrecisionScope {
 public:
  PrecisionScope(const v1::JobSpec& spec, c10::DeviceType device) {
    if (spec.precision() == v1::JobSpec::BF16) autocast_.emplace(device, at::kBFloat16);
    if (spec.precision() == v1::JobSpec::FP16 && device == c10::DeviceType::CUDA) {
      autocast_.emplace(device, at::kHalf);
    }
  }

 private:
  std::optional<ddp::AutocastGuard> autocast_;
};

// Each rank evaluates every world_size-th validation example; sums are reduced so every
// rank reports the same numbers. The sums stay on `device` (float64) until reduced: one read
// of three numbers per evaluation, not one per batch.
EvalResult Evaluate(models::Model& model, const data::Dataset& dataset,
                    const std::vector<int64_t>& validation, const TrainerOptions& options,
                    ddp::ProcessGroup& group, int64_t batch_size, const v1::JobSpec& spec,
                    const c10::Device& device) {
  std::vector<int64_t> mine;
  for (size_t i = options.rank; i < validation.size(); i += options.world_size) {
    mine.push_back(validation[i]);
  }
  model.module()->eval();
  const auto sum_options = at::TensorOptions().dtype(at::kDouble).device(device);
  at::Tensor loss_sum = torch::zeros({}, sum_options), correct = torch::zeros({}, sum_options);
  double count = 0;
  {
    torch::NoGradGuard no_grad;
    data::BatchLoader loader(dataset, mine, batch_size, /*drop_last=*/false, /*prefetch=*/2,
                             /*start_batch=*/0, /*pin_memory=*/device.is_cuda());
    at::Tensor x, y;
    while (loader.Next(&x, &y)) {
      x = ToDevice(x, device);
      y = ToDevice(y, device);
      PrecisionScope precision(spec, device.type());
      at::Tensor output = model.Forward(x);
      const double items = dataset.shape().task == Task::kLanguageModel
                               ? static_cast<double>(y.numel())
                               : static_cast<double>(y.size(0));
      loss_sum += Loss(dataset.shape().task, output, y).to(at::kDouble) * items;
      if (dataset.shape().task == Task::kClassification) {
        correct += output.argmax(1).eq(y).sum().to(at::kDouble);
      }
      count += items;
    }
  }
  model.module()->train();
  at::Tensor sums = torch::stack({loss_sum, correct, torch::full({}, count, sum_options)});
  group.AllReduce(sums, ddp::ReduceOp::kSum)->Wait();
  sums = sums.cpu();
  EvalResult result;
  const double total = sums[2].item<double>();
  result.loss = total > 0 ? sums[0].item<double>() / total : 0;
  result.metrics["loss"] = result.loss;
  if (dataset.shape().task == Task::kClassification && total > 0) {
    result.metrics["accuracy"] = sums[1].item<double>() / total;
  }
  if (dataset.shape().task == Task::kLanguageModel)
    result.metrics["perplexity"] = std::exp(result.loss);
  return result;
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

// Per-interval sums behind a progress line.
struct Interval {
  StepReport sums;
  double loss = 0;
  int64_t steps = 0;
  Clock::time_point start = Clock::now();
};

// One rank's training run. The constructor sets everything up; Run() resumes, then steps
// until the end, reporting, evaluating and checkpointing between steps:
//   setup    spec, device and backend, threads, data, process group, model (moved to its
//            device before the optimizer sees it), optimizer, step plan
//   resume   rank 0 loads the latest checkpoint and broadcasts it; then DDP is built
//   step     forward/backward over the micro-batches, optimizer step
//   report   a progress line every log_every_steps (loss averaged over ranks)
//   evaluate every eval_every_steps and at the end
//   checkpoint  rank 0 snapshots every checkpoint.every_steps and at the end; uploads run on
//            a background thread
//   preempt  on a stop request rank 0 saves the last finished step and leaves
class TrainingRun {
 public:
  TrainingRun(const v1::JobSpec& user_spec, const TrainerOptions& options)
      : options_(options),
        log_(options.log ? *options.log : std::cerr),
        leader_(options.rank == 0),
        spec_(CheckedSpec(user_spec, options)),
        placement_(ResolvePlacement(spec_, options)) {
    CheckFp16();
    log_ << "gradhub-trainer: rank " << options_.rank << " trains on " << placement_.device.str()
         << " with " << (placement_.backend == ddp::Backend::kNccl ? "NCCL" : "Gloo") << "\n";
    ConfigureThreads();
    BuildData();
    BuildModel();
    PlanSteps();
    if (leader_ && options_.checkpoints) {
      writer_ = std::make_unique<AsyncCheckpointWriter>(options_.checkpoints, &log_);
    }
  }

  TrainResult Run() {
    Resume();
    interval_ = Interval();  // throughput counts from the first step, not from setup
    const auto loop_start = Clock::now();
    while (step_ < total_steps_) RunEpoch();
    loop_seconds_ = Seconds(Clock::now() - loop_start);
    return Finish();
  }

 private:
  // --- setup ---

  static v1::JobSpec CheckedSpec(const v1::JobSpec& user_spec, const TrainerOptions& options) {
    CheckJobSpec(user_spec);
    v1::JobSpec spec = WithDefaults(user_spec);
    // A spec that leaves worldSize unset runs at whatever size it is launched with, as torchrun.
    if (user_spec.distributed().world_size() != 0 &&
        user_spec.distributed().world_size() != options.world_size) {
      throw UserError("distributed.worldSize", std::to_string(spec.distributed().world_size()) +
                                                   " but the trainer runs " +
                                                   std::to_string(options.world_size) + " ranks");
    }
    spec.mutable_distributed()->set_world_size(options.world_size);
    // NCCL on a CPU node: ResolvePlacement; FP16 on one: CheckFp16. Validation at submission
    // cannot know where the ranks land; the trainer does.
    return spec;
  }

  // precision FP16 runs on a GPU (autocast to float16) with a loss scaler; refused on the CPU
  // (its autocast has no float16; a GLOO backend trains there too), except in tests.
  // Of the distributed settings, shardOptimizerState works: every rank unscales the same
  // averaged gradients, finds the same overflow and skips the same ZeRO step. Refused:
  //   localSgd   its local steps sync no gradients, so ranks would overflow, skip and scale
  //              apart, and the scaler's state would become per-rank state;
  //   POWER_SGD  its error feedback and warm-start Q would take in the scaled gradients, an
  //              overflow's inf included, and carry them into every later step.
  void CheckFp16() {
    if (spec_.precision() != v1::JobSpec::FP16) return;
    if (!placement_.cuda() && !options_.fp16_scaling_on_cpu_for_test) {
      throw UserError("precision",
                      "FP16 (autocast to float16 with dynamic loss scaling) needs a CUDA GPU; "
                      "this rank trains on the CPU: use BF16 (autocast to bfloat16) or FP32, "
                      "or backend NCCL on a GPU node");
    }
    const auto& distributed = spec_.distributed();
    if (distributed.has_local_sgd()) {
      throw UserError("distributed.localSgd",
                      "cannot be combined with precision FP16 (ranks would skip different "
                      "overflowed steps): use BF16 or FP32, or synchronous training");
    }
    if (distributed.comm_hook() == v1::DistributedSpec::POWER_SGD) {
      throw UserError("distributed.commHook",
                      "POWER_SGD cannot be combined with precision FP16 (its error feedback "
                      "would keep overflowed gradients): use FP16 or BF16 compression, or "
                      "precision BF16");
    }
    scaler_.emplace(placement_.cuda() ? ddp::LossScalerOptions{}
                                      : *options_.fp16_scaling_on_cpu_for_test);
  }

  void ConfigureThreads() {
    const int threads = options_.threads > 0
                            ? options_.threads
                            : std::max(1, static_cast<int>(std::thread::hardware_concurrency()) /
                                              std::max(1, options_.local_world_size));
    at::set_num_threads(threads);
    LimitBlasThreads(threads);
    at::manual_seed(spec_.seed());
  }

  void BuildData() {
    const int64_t context =
        spec_.model().has_transformer() ? spec_.model().transformer().context_length() : 0;
    dataset_ = data::LoadDataset(spec_.dataset(), spec_.seed(), context);
    split_ =
        data::SplitIndices(dataset_->size(), spec_.dataset().validation_fraction(), spec_.seed());
    dataset_->Normalize(split_.train);
  }

  void BuildModel() {
    ddp::ProcessGroupOptions group_options;
    group_options.rank = options_.rank;
    group_options.size = options_.world_size;
    group_options.store = options_.store;
    group_options.timeout = options_.collective_timeout;
    // NCCL: the engine's group, with its own collective timeout and abort of a communicator
    // whose peer died (gpu_worker/ddp/comm/nccl), on this rank's GPU.
    group_options.backend = placement_.backend;
    if (placement_.cuda()) group_options.device = placement_.device.index();
    group_ = ddp::CreateProcessGroup(group_options);
    model_ = models::BuildModel(spec_.model(), dataset_->shape());
    module_ = model_->module();
    // Before the optimizer is built: its state (momentum, moments) is then made on the device.
    module_->to(placement_.device);
    module_->train();
    const auto& distributed = spec_.distributed();
    if (distributed.shard_optimizer_state()) {
      zero_ = std::make_unique<ddp::ZeroRedundancyOptimizer>(
          module_->parameters(), group_, [this](std::vector<at::Tensor> parameters) {
            return BuildOptimizer(spec_.optimizer(), std::move(parameters));
          });
    } else {
      optimizer_ = BuildOptimizer(spec_.optimizer(), module_->parameters());
    }
    if (distributed.has_local_sgd()) {
      ddp::LocalSgdOptions local;
      local.period = distributed.local_sgd().period();
      local.warmup_steps = distributed.local_sgd().warmup_steps();
      averager_ =
          std::make_unique<ddp::PeriodicModelAverager>(module_->parameters(), group_, local);
    }
  }

  // The optimizer whose learning rate is set and whose state this rank holds: with ZeRO, its
  // shard's.
  torch::optim::Optimizer& LocalOptimizer() { return zero_ ? zero_->local() : *optimizer_; }

  // Whether ranks hold state the others lack (see RankStateParts): then checkpoints gather it
  // from every rank, which makes saving a collective.
  bool PerRankState() const {
    const auto& distributed = spec_.distributed();
    return distributed.shard_optimizer_state() || distributed.has_local_sgd() ||
           distributed.comm_hook() == v1::DistributedSpec::POWER_SGD;
  }

  RankStateParts RankState() {
    RankStateParts parts;
    if (averager_) {
      parts.module = module_.get();
      parts.optimizer = optimizer_.get();
    }
    if (zero_) parts.optimizer = &zero_->local();
    if (ddp_) parts.powersgd = ddp_->powersgd();
    return parts;
  }

  void PlanSteps() {
    batch_ = spec_.batch_size_per_rank();
    accumulation_ = spec_.grad_accumulation_steps();
    const bool drop_last = spec_.dataset().drop_last();
    sampler_ =
        std::make_unique<data::DistributedSampler>(split_.train, options_.world_size, options_.rank,
                                                   spec_.seed(), /*shuffle=*/true, drop_last);
    const int64_t per_rank = sampler_->per_rank();
    const int64_t micro_per_epoch =
        drop_last ? per_rank / batch_ : (per_rank + batch_ - 1) / batch_;
    steps_per_epoch_ = micro_per_epoch / accumulation_;
    if (steps_per_epoch_ == 0) {
      throw UserError("batchSizePerRank",
                      std::to_string(batch_) + " x " + std::to_string(accumulation_) +
                          " micro-batches exceed the " + std::to_string(per_rank) +
                          " training examples of each rank");
    }
    total_steps_ = spec_.max_steps();
    if (spec_.max_epochs() > 0) {
      const int64_t by_epochs = spec_.max_epochs() * steps_per_epoch_;
      total_steps_ = total_steps_ > 0 ? std::min(total_steps_, by_epochs) : by_epochs;
    }
    if (leader_) {
      log_ << "gradhub-trainer: " << model_->Describe() << "; " << split_.train.size()
           << " train / " << split_.validation.size() << " validation examples; " << total_steps_
           << " steps of " << batch_ * accumulation_ * options_.world_size << " samples\n";
    }
  }

  // --- resume ---

  // Rank 0 reads the checkpoint (one download, one hash check) and broadcasts it: every rank
  // needs the optimizer state, and all then start from the same bytes even if they would
  // have raced a commit. Runs on every rank whether or not it has a sink.
  void Resume() {
    if (PerRankState()) {
      // Every rank takes part in saving per-rank state, so every rank must know whether
      // rank 0 saves at all.
      at::Tensor saves =
          torch::tensor({int64_t{leader_ && options_.checkpoints ? 1 : 0}}).to(placement_.device);
      group_->Broadcast({saves}, 0)->Wait();
      checkpointing_ = saves.item<int64_t>() != 0;
    }
    std::optional<std::string> bytes;
    if (leader_ && options_.checkpoints) {
      if (std::optional<Checkpoint> latest = options_.checkpoints->LoadLatest()) {
        bytes = std::move(latest->bytes);
      }
    }
    bytes = BroadcastBytes(*group_, std::move(bytes), placement_.device);
    std::string rank_state;
    if (bytes) {
      ddp::LossScaler::State scaler_state = scaler_ ? scaler_->state() : ddp::LossScaler::State{};
      step_ =
          RestoreState(*bytes, *module_, zero_ ? nullptr : optimizer_.get(), spec_, options_.rank,
                       &rank_state, placement_.device, scaler_ ? &scaler_state : nullptr);
      if (scaler_) scaler_->set_state(scaler_state);
      resumed_from_step_ = step_;
      last_checkpoint_step_ = step_;
      log_ << "gradhub-trainer: rank " << options_.rank << " resumed from step " << step_ << "\n";
    }
    ddp::DdpOptions ddp_options;
    ddp_options.reducer.bucket_cap_bytes =
        static_cast<int64_t>(spec_.distributed().bucket_cap_mb() * (1 << 20));
    ddp_options.reducer.find_unused_parameters = spec_.distributed().find_unused_parameters();
    if (spec_.distributed().comm_hook() == v1::DistributedSpec::FP16) {
      ddp_options.reducer.comm_hook = ddp::CommHook::kFp16;
    } else if (spec_.distributed().comm_hook() == v1::DistributedSpec::BF16) {
      ddp_options.reducer.comm_hook = ddp::CommHook::kBf16;
    } else if (spec_.distributed().comm_hook() == v1::DistributedSpec::POWER_SGD) {
      const auto& p = spec_.distributed().power_sgd();
      ddp_options.reducer.comm_hook = ddp::CommHook::kPowerSgd;
      ddp_options.reducer.powersgd.matrix_approximation_rank = p.matrix_approximation_rank();
      ddp_options.reducer.powersgd.start_iter = p.start_step();
      ddp_options.reducer.powersgd.min_compression_rate = p.min_compression_rate();
      ddp_options.reducer.powersgd.error_feedback = p.error_feedback();
      ddp_options.reducer.powersgd.warm_start = p.warm_start();
      ddp_options.reducer.powersgd.seed = spec_.seed();
    }
    ddp_ = std::make_unique<ddp::DistributedDataParallel>(module_, group_, ddp_options);
    // After DDP's broadcast of rank 0's parameters: a local SGD replica gets its own back.
    if (bytes && PerRankState()) {
      if (rank_state.empty()) {
        throw std::runtime_error("the checkpoint of step " + std::to_string(step_) +
                                 " holds no state of rank " + std::to_string(options_.rank));
      }
      RestoreRankState(rank_state, RankState(), placement_.device);
    }
  }

  // --- step ---

  void RunEpoch() {
    const int64_t epoch = step_ / steps_per_epoch_;
    const int64_t first_micro = (step_ % steps_per_epoch_) * accumulation_;
    data::BatchLoader loader(*dataset_, sampler_->EpochIndices(epoch), batch_,
                             spec_.dataset().drop_last(), spec_.dataset().prefetch_batches(),
                             first_micro, /*pin_memory=*/placement_.cuda());
    for (int64_t in_epoch = step_ % steps_per_epoch_;
         in_epoch < steps_per_epoch_ && step_ < total_steps_; ++in_epoch) {
      RunStep(loader);
      const bool last = step_ == total_steps_;
      MaybeReport(last);
      if (spec_.eval_every_steps() > 0 && step_ % spec_.eval_every_steps() == 0 && !last) {
        last_eval_ = EvaluateAndReport();
      }
      const int64_t every = spec_.checkpoint().every_steps();
      if ((every > 0 && step_ % every == 0) || last) SaveCheckpoint();
      if (last) break;  // Finish() sends the last step with the final evaluation
      SendStepTelemetry();
      StopIfRequested();
    }
  }

  // One optimizer step: the micro-batches (all but the last without gradient sync), the NaN
  // check, clipping, the scheduled learning rate, the step. Adds its timings to the interval.
  void RunStep(data::BatchLoader& loader) {
    const auto step_start = Clock::now();
    at::manual_seed(StepSeed(spec_.seed(), options_.rank, step_));
    ddp_->ZeroGrad();
    StepReport phases;  // this step's, summed over micro-batches
    // A local SGD step sends nothing: every micro-batch runs without gradient sync.
    const bool local = averager_ && !averager_->Synchronous(step_);
    TakeStepLoss(ForwardBackward(loader, local, phases));
    const auto optimizer_start = Clock::now();
    const double lr = LearningRateAt(spec_, step_);
    // Parameters are float32: a larger step size cannot be applied, only diverge.
    if (!(std::abs(lr) <= std::numeric_limits<float>::max())) {
      throw TrainingFailure("learning rate " + std::to_string(lr) + " overflows float32 at step " +
                            std::to_string(step_));
    }
    ApplyGradients(lr);
    step_bytes_ = local ? 0 : ddp_->last_reduction().bytes;
    step_allreduce_seconds_ = local ? 0 : Seconds(ddp_->last_reduction().allreduce);
    if (averager_) step_bytes_ += averager_->AfterStep(step_);
    const auto step_end = Clock::now();
    ++step_;
    phases.optimizer_seconds = Seconds(step_end - optimizer_start);
    phases.step_seconds = Seconds(step_end - step_start);
    phases.learning_rate = lr;
    phases.loss = last_loss_;  // read at this step: ReadsLossAt is true with telemetry
    AddToInterval(phases);
    if (options_.telemetry) StartStepTelemetry(phases);
  }

  // The micro-batches of one step: forward, loss and backward of each, gradients synced at the
  // last unless `local`. With FP16 the backward is of the scaled loss (LossScaler), while the
  // loss returned is the true one: its NaN check fails the run only for a non-finite loss, not
  // for the overflowed gradients of a skipped step. Returns the step's loss (float64, on the
  // training device: read by TakeStepLoss) and adds the phases' timings to `phases`.
  at::Tensor ForwardBackward(data::BatchLoader& loader, bool local, StepReport& phases) {
    at::Tensor step_loss, x, y;
    for (int64_t micro = 0; micro < accumulation_; ++micro) {
      if (!loader.Next(&x, &y)) throw std::logic_error("data loader ended before the epoch");
      x = ToDevice(x, placement_.device);
      y = ToDevice(y, placement_.device);
      std::optional<ddp::DistributedDataParallel::NoSyncGuard> no_sync;
      if (local || micro + 1 < accumulation_) no_sync.emplace(ddp_.get());
      at::Tensor loss = ddp_->Forward([&] {
        PrecisionScope precision(spec_, placement_.device.type());
        return Loss(dataset_->shape().task, model_->Forward(x), y);
      });
      const at::Tensor scaled = loss / accumulation_;
      ddp_->Backward(scaler_ ? scaler_->Scale(scaled) : scaled);
      const at::Tensor part = loss.detach().to(at::kDouble) / accumulation_;
      step_loss = micro == 0 ? part : step_loss + part;
      phases.forward_seconds += Seconds(ddp_->last_timings().forward);
      phases.backward_seconds += Seconds(ddp_->last_timings().backward);
      phases.allreduce_wait_seconds += Seconds(ddp_->last_timings().allreduce_wait);
    }
    return step_loss;
  }

  // After the gradient sync: with FP16, unscale (before clipping, which needs the true norm)
  // and skip the step when a gradient overflowed, as every rank does (mixed_precision.h); then
  // clip, set the learning rate `lr` and step.
  void ApplyGradients(double lr) {
    if (scaler_) {
      const bool found_inf = scaler_->Unscale(module_->parameters());
      scaler_->Update(found_inf);
      if (found_inf) {
        if (leader_) {
          log_ << "gradhub-trainer: step " << step_ + 1
               << " skipped: a gradient overflowed float16; loss scale now " << scaler_->scale()
               << ", " << scaler_->skipped_steps() << " steps skipped\n";
        }
        return;
      }
    }
    if (spec_.grad_clip_norm() > 0 && placement_.cuda()) {
      ClipGradNormOnDevice(module_->parameters(), spec_.grad_clip_norm());
    } else if (spec_.grad_clip_norm() > 0) {
      torch::nn::utils::clip_grad_norm_(module_->parameters(), spec_.grad_clip_norm());
    }
    SetLearningRate(LocalOptimizer(), lr);
    if (zero_) {
      zero_->Step();
    } else {
      optimizer_->step();
    }
  }

  // Steps (counted from 1) after which the loss is read back from a GPU: those that report it
  // (progress lines, and every step's telemetry when there is a metrics service), that
  // evaluate or checkpoint (which wait for the GPU anyway, and must not save a model that went
  // NaN unnoticed), and the last. Every step on the CPU, where reading waits for nothing.
  bool ReadsLossAt(int64_t step) const {
    if (!placement_.cuda() || options_.telemetry) return true;
    const int64_t eval = spec_.eval_every_steps(), every = spec_.checkpoint().every_steps();
    return step % spec_.log_every_steps() == 0 || step == total_steps_ ||
           (eval > 0 && step % eval == 0) || (every > 0 && step % every == 0);
  }

  // Adds the loss of the step being done (step_ + 1) to those not yet read, and reads them
  // when ReadsLossAt says so.
  void TakeStepLoss(const at::Tensor& step_loss) {
    unread_loss_ = unread_steps_ == 0 ? step_loss : unread_loss_ + step_loss;
    last_step_loss_ = step_loss;
    ++unread_steps_;
    if (ReadsLossAt(step_ + 1)) ReadLoss(step_);
  }

  // Reads the losses not yet read (a wait for the GPU), the last of them step `last` (counted
  // from 0, as in the failure message): adds them to the interval and fails the run with
  // TrainingFailure if any was not finite, naming the step, or on a GPU the steps since the
  // last read.
  void ReadLoss(int64_t last) {
    if (unread_steps_ == 0) return;
    double sum = 0;
    if (unread_steps_ == 1) {
      sum = last_loss_ = unread_loss_.item<double>();
    } else {
      const at::Tensor both = torch::stack({unread_loss_, last_step_loss_}).cpu();
      sum = both[0].item<double>();
      last_loss_ = both[1].item<double>();
    }
    const int64_t first = last + 1 - unread_steps_;
    unread_steps_ = 0;
    if (!std::isfinite(sum)) {
      throw TrainingFailure(
          "loss is " + std::to_string(sum) +
          (first == last ? " at step " + std::to_string(last)
                         : " in steps " + std::to_string(first) + " to " + std::to_string(last)) +
          " on rank " + std::to_string(options_.rank));
    }
    interval_.loss += sum;
  }

  void AddToInterval(const StepReport& step) {
    run_allreduce_bytes_ += step_bytes_;
    run_allreduce_seconds_ += step_allreduce_seconds_;
    StepReport& sums = interval_.sums;
    sums.forward_seconds += step.forward_seconds;
    sums.backward_seconds += step.backward_seconds;
    sums.allreduce_wait_seconds += step.allreduce_wait_seconds;
    sums.optimizer_seconds += step.optimizer_seconds;
    sums.step_seconds += step.step_seconds;
    sums.allreduce_bytes = step_bytes_;
    sums.buckets = ddp_->last_reduction().buckets;
    sums.learning_rate = step.learning_rate;
    ++interval_.steps;  // its loss is added when read (ReadLoss)
  }

  // --- telemetry ---

  // This rank's record of the step just done. Sent at the end of the step's iteration, once
  // an evaluation and a checkpoint of the step have added theirs.
  void StartStepTelemetry(const StepReport& phases) {
    StepReport& r = step_telemetry_;
    r = phases;
    r.step = step_;
    r.epoch = (step_ - 1) / steps_per_epoch_;
    r.samples = batch_ * accumulation_;
    r.samples_per_second = r.step_seconds > 0 ? r.samples / r.step_seconds : 0;
    r.allreduce_bytes = step_bytes_;
    r.allreduce_seconds = step_allreduce_seconds_;
    r.buckets = ddp_->last_reduction().buckets;
    r.world_size = options_.world_size;
  }

  void SendStepTelemetry() {
    if (options_.telemetry) options_.telemetry->Report(step_telemetry_);
  }

  // --- report ---

  void MaybeReport(bool last) {
    if (step_ % spec_.log_every_steps() != 0 && !last) return;
    // The loss of all ranks, not only rank 0's shard.
    at::Tensor mean_loss =
        torch::tensor({interval_.loss / interval_.steps}, at::kDouble).to(placement_.device);
    group_->AllReduce(mean_loss, ddp::ReduceOp::kAverage)->Wait();
    const double elapsed = Seconds(Clock::now() - interval_.start);
    StepReport r = interval_.sums;
    for (double* value : {&r.forward_seconds, &r.backward_seconds, &r.allreduce_wait_seconds,
                          &r.optimizer_seconds, &r.step_seconds}) {
      *value /= interval_.steps;
    }
    r.step = step_;
    r.epoch = (step_ - 1) / steps_per_epoch_;
    r.loss = mean_loss.item<double>();
    r.samples_per_second =
        elapsed > 0 ? interval_.steps * batch_ * accumulation_ * options_.world_size / elapsed : 0;
    Emit(r, ProgressEvent::kProgress);
    if (leader_) {
      log_ << "gradhub-trainer: step " << step_ << "/" << total_steps_ << " loss " << r.loss
           << " lr " << r.learning_rate << " " << static_cast<int64_t>(r.samples_per_second)
           << " samples/s";
      if (scaler_) {
        log_ << " loss scale " << scaler_->scale() << " skipped " << scaler_->skipped_steps();
      }
      log_ << "\n";
    }
    interval_ = Interval();
  }

  void Emit(const StepReport& r, ProgressEvent event) {
    if (!leader_ || options_.progress == nullptr) return;
    ProgressRecord record;
    record.event = event;
    record.step = r.step;
    record.total_steps = total_steps_;
    if (r.eval_metrics.empty()) {
      record.epoch = r.epoch;
      record.loss = r.loss;
      record.learning_rate = r.learning_rate;
      record.samples_per_second = r.samples_per_second;
      record.forward_seconds = r.forward_seconds;
      record.backward_seconds = r.backward_seconds;
      record.allreduce_wait_seconds = r.allreduce_wait_seconds;
      record.optimizer_seconds = r.optimizer_seconds;
      record.step_seconds = r.step_seconds;
      record.allreduce_bytes = r.allreduce_bytes;
      AddLossScaler(record);
    }
    record.eval_metrics = r.eval_metrics;
    *options_.progress << FormatProgressRecord(record) << std::endl;
  }

  // FP16: the loss scale and the steps skipped so far.
  void AddLossScaler(ProgressRecord& record) const {
    if (!scaler_) return;
    record.loss_scale = scaler_->scale();
    record.skipped_steps = scaler_->skipped_steps();
  }

  // --- evaluate ---

  EvalResult EvaluateAndReport() {
    if (split_.validation.empty()) return EvalResult{};
    EvalResult eval = Evaluate(*model_, *dataset_, split_.validation, options_, *group_, batch_,
                               spec_, placement_.device);
    step_telemetry_.eval_metrics = eval.metrics;
    StepReport r;
    r.step = step_;
    r.eval_metrics = eval.metrics;
    Emit(r, ProgressEvent::kEval);
    if (leader_) {
      log_ << "gradhub-trainer: step " << step_ << " validation";
      for (const auto& [name, value] : eval.metrics) log_ << " " << name << " " << value;
      log_ << "\n";
    }
    return eval;
  }

  // --- checkpoint ---

  // Rank 0 only: the snapshot (the state serialized into host memory) is taken here, the
  // upload runs on the writer's thread. The loop waits only for a previous upload still
  // running; that wait and the snapshot are the stall a checkpoint costs.
  // With per-rank state every rank calls it at the same steps (it gathers each rank's state
  // to rank 0), except on a stop request, which only rank 0 acts on: then it saves nothing
  // and returns false.
  bool SaveCheckpoint(bool stopping = false) {
    if (last_checkpoint_step_ == step_) return true;
    std::vector<std::string> rank_states;
    const auto start = Clock::now();
    if (PerRankState()) {
      if (!checkpointing_ || stopping) return false;
      rank_states = AllGatherBytes(*group_, SerializeRankState(RankState()), placement_.device);
      last_checkpoint_step_ = step_;
    }
    if (!writer_) return false;
    std::string bytes = SerializeState(*module_, zero_ ? nullptr : optimizer_.get(), step_, spec_,
                                       rank_states, scaler_ ? &scaler_->state() : nullptr);
    checkpoint_snapshot_seconds_ += Seconds(Clock::now() - start);
    checkpoint_bytes_ = static_cast<int64_t>(bytes.size());
    const double waited = writer_->Submit({step_, std::move(bytes)});
    checkpoint_wait_seconds_ += waited;
    step_telemetry_.checkpoint_save_seconds = Seconds(Clock::now() - start);
    last_checkpoint_step_ = step_;
    ++checkpoints_saved_;
    return true;
  }

  // Waits for the save in flight; a save that failed or did not end in time throws, so the
  // attempt ends as an infrastructure failure and restarts from the previous checkpoint.
  void FlushCheckpoints(std::chrono::milliseconds timeout) {
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

  // --- preempt ---

  void StopIfRequested() {
    if (options_.stop_requested == nullptr || !options_.stop_requested->load()) return;
    if (!stop_seen_) stop_seen_ = Clock::now();
    if (leader_) {
      ReadLoss(step_ - 1);  // a GPU may hold unread losses: never save a model that went NaN
      const bool saved_this_step = SaveCheckpoint(/*stopping=*/true);
      std::string saved = "no checkpoint store";
      if (writer_) {
        try {
          FlushCheckpoints(options_.preempt_grace);
          saved = "checkpoint of step " + std::to_string(step_) + " committed";
          if (!saved_this_step) {
            saved = "checkpoint of step " + std::to_string(last_checkpoint_step_) +
                    " is the latest: per-rank state (shardOptimizerState, localSgd, POWER_SGD) "
                    "is gathered only at checkpoint.everySteps and at the end";
          }
        } catch (const std::runtime_error& error) {  // e.g. refused: the job was cancelled
          saved = std::string("no checkpoint: ") + error.what();
        }
      }
      throw Preempted("stopped after step " + std::to_string(step_) + "; " + saved);
    }
    // Others wait for rank 0 to save and leave; their next collective then fails.
    if (Clock::now() - *stop_seen_ > options_.preempt_grace) {
      throw Preempted("stopped after step " + std::to_string(step_));
    }
  }

  // --- finish ---

  TrainResult Finish() {
    last_eval_ = EvaluateAndReport();
    if (resumed_from_step_ != step_) SendStepTelemetry();
    FlushCheckpoints(std::chrono::hours(24));
    TrainResult result;
    result.steps = step_;
    result.resumed_from_step = resumed_from_step_;
    result.final_loss = last_loss_;
    result.eval_metrics = last_eval_.metrics;
    result.parameters_sha256 = ParametersSha256(*module_);
    result.checkpoints_saved = checkpoints_saved_;
    result.checkpoint_snapshot_seconds = checkpoint_snapshot_seconds_;
    result.checkpoint_wait_seconds = checkpoint_wait_seconds_;
    if (scaler_) {
      result.skipped_steps = scaler_->skipped_steps();
      result.loss_scale = scaler_->scale();
    }
    // Every rank reports its end state, so a launcher can tell the ranks agree.
    if (options_.progress) {
      *options_.progress << FormatProgressRecord(DoneRecord(result)) << std::endl;
    }
    return result;
  }

  // This rank's end state and its run's totals (progress_record.h, event done).
  ProgressRecord DoneRecord(const TrainResult& result) {
    ProgressRecord record;
    record.event = ProgressEvent::kDone;
    record.rank = options_.rank;
    record.step = step_;
    record.total_steps = total_steps_;
    record.loss = last_loss_;
    record.train_seconds = loop_seconds_;
    record.allreduce_bytes = run_allreduce_bytes_;
    record.allreduce_seconds = run_allreduce_seconds_;
    record.optimizer_state_bytes = ddp::OptimizerStateBytes(LocalOptimizer());
    record.bus_bandwidth_bytes_per_second =
        BusBandwidth(run_allreduce_bytes_, run_allreduce_seconds_, options_.world_size);
    AddLossScaler(record);
    record.eval_metrics = result.eval_metrics;
    if (writer_) {
      record.checkpoints = checkpoints_saved_;
      record.checkpoint_bytes = checkpoint_bytes_;
      record.checkpoint_snapshot_seconds = checkpoint_snapshot_seconds_;
      record.checkpoint_wait_seconds = checkpoint_wait_seconds_;
    }
    record.parameters_sha256 = result.parameters_sha256;
    return record;
  }

  const TrainerOptions& options_;
  std::ostream& log_;
  const bool leader_;
  const v1::JobSpec spec_;  // with defaults, world size as launched
  const Placement placement_;

  std::unique_ptr<data::Dataset> dataset_;
  data::Split split_;
  std::shared_ptr<ddp::ProcessGroup> group_;
  std::unique_ptr<models::Model> model_;
  std::shared_ptr<torch::nn::Module> module_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;  // null with ZeRO
  std::unique_ptr<ddp::ZeroRedundancyOptimizer> zero_;
  std::unique_ptr<ddp::PeriodicModelAverager> averager_;  // localSgd
  std::unique_ptr<ddp::DistributedDataParallel> ddp_;
  std::unique_ptr<data::DistributedSampler> sampler_;
  std::unique_ptr<AsyncCheckpointWriter> writer_;
  // precision FP16 only: the same state on every rank, which skip the same steps.
  std::optional<ddp::LossScaler> scaler_;

  int64_t batch_ = 0, accumulation_ = 0, steps_per_epoch_ = 0, total_steps_ = 0;
  int64_t step_ = 0;            // optimizer steps done
  bool checkpointing_ = false;  // rank 0 saves (known on every rank with per-rank state)
  // What the last step sent: its gradients (none for a local step) plus a parameter average.
  int64_t step_bytes_ = 0;
  double step_allreduce_seconds_ = 0;
  int64_t resumed_from_step_ = -1;
  int64_t last_checkpoint_step_ = -1;
  int64_t checkpoints_saved_ = 0;
  double checkpoint_snapshot_seconds_ = 0, checkpoint_wait_seconds_ = 0;
  int64_t checkpoint_bytes_ = 0;  // of the last snapshot
  double loop_seconds_ = 0;       // the steps of this run, checkpoints and evaluations included
  // The engine's own measure of this rank's gradient allreduces over the run.
  int64_t run_allreduce_bytes_ = 0;
  double run_allreduce_seconds_ = 0;
  double last_loss_ = 0;  // of the last step whose loss was read
  // The losses of steps not read yet (ReadsLossAt), their sum on the device, and the last one.
  at::Tensor unread_loss_, last_step_loss_;
  int64_t unread_steps_ = 0;
  EvalResult last_eval_;
  Interval interval_;
  StepReport step_telemetry_;  // of the step in progress of being reported
  std::optional<Clock::time_point> stop_seen_;
};

}  // namespace

TrainResult Train(const v1::JobSpec& spec, const TrainerOptions& options) {
  return TrainingRun(spec, options).Run();
}

}  // namespace gradhub::trainer
