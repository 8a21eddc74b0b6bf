#include "gpu_worker/trainer/trainer.h"

#include <dlfcn.h>
#include <torch/torch.h>

#include <cmath>
#include <cstring>
#include <iomanip>
#include <iostream>
#include <limits>
#include <optional>
#include <sstream>
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
#include "services/common/contract/user_error.h"
#include "services/common/json_text.h"
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

// One JSON object per line; keys in insertion order, numbers printed exactly enough.
class JsonLine {
 public:
  JsonLine& Add(const std::string& key, double value) {
    std::ostringstream number;
    if (std::isfinite(value)) {
      number << std::setprecision(9) << value;
    } else {
      number << "null";
    }
    return Raw(key, number.str());
  }
  JsonLine& Add(const std::string& key, int64_t value) { return Raw(key, std::to_string(value)); }
  JsonLine& Add(const std::string& key, const std::string& value) {
    return Raw(key, QuoteJson(value));
  }
  std::string str() const { return "{" + body_ + "}"; }

 private:
  JsonLine& Raw(const std::string& key, const std::string& value) {
    body_ += (body_.empty() ? "\"" : ",\"") + key + "\":" + value;
    return *this;
  }
  std::string body_;
};

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

struct EvalResult {
  double loss = 0;
  std::map<std::string, double> metrics;
};

// Forward and loss in its scope run under autocast to bfloat16 when the spec asks for BF16;
// nothing changes otherwise. (FP16 never gets here: CheckedSpec refuses it on CPU.)
class PrecisionScope {
 public:
  explicit PrecisionScope(const v1::JobSpec& spec) {
    if (spec.precision() == v1::JobSpec::BF16)
      autocast_.emplace(c10::DeviceType::CPU, at::kBFloat16);
  }

 private:
  std::optional<ddp::AutocastGuard> autocast_;
};

// Each rank evaluates every world_size-th validation example; sums are reduced so every
// rank reports the same numbers.

EvalResult Evaluate(models::Model& model, const data::Dataset& dataset,
                    const std::vector<int64_t>& validation, const TrainerOptions& options,
                    ddp::ProcessGroup& group, int64_t batch_size, const v1::JobSpec& spec) {
  std::vector<int64_t> mine;
  for (size_t i = options.rank; i < validation.size(); i += options.world_size) {
    mine.push_back(validation[i]);
  }
  model.module()->eval();
  double loss_sum = 0, correct = 0, count = 0;
  {
    torch::NoGradGuard no_grad;
    data::BatchLoader loader(dataset, mine, batch_size, /*drop_last=*/false, /*prefetch=*/2);
    at::Tensor x, y;
    while (loader.Next(&x, &y)) {
      PrecisionScope precision(spec);
      at::Tensor output = model.Forward(x);
      const double items = dataset.shape().task == Task::kLanguageModel
                               ? static_cast<double>(y.numel())
                               : static_cast<double>(y.size(0));
      loss_sum += Loss(dataset.shape().task, output, y).item<double>() * items;
      if (dataset.shape().task == Task::kClassification) {
        correct += output.argmax(1).eq(y).sum().item<double>();
      }
      count += items;
    }
  }
  model.module()->train();
  at::Tensor sums = torch::tensor({loss_sum, correct, count}, at::kDouble);
  group.AllReduce(sums, ddp::ReduceOp::kSum)->Wait();
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
// to whole int64 elements because the process groups move typed tensors.
std::optional<std::string> BroadcastBytes(ddp::ProcessGroup& group,
                                          std::optional<std::string> bytes) {
  at::Tensor length = torch::tensor({bytes ? static_cast<int64_t>(bytes->size()) : int64_t{-1}});
  group.Broadcast({length}, 0)->Wait();
  const int64_t size = length.item<int64_t>();
  if (size < 0) return std::nullopt;
  at::Tensor payload = torch::zeros({(size + 7) / 8}, at::kLong);
  if (group.rank() == 0) std::memcpy(payload.data_ptr(), bytes->data(), bytes->size());
  group.Broadcast({payload}, 0)->Wait();
  return std::string(static_cast<const char*>(payload.data_ptr()), static_cast<size_t>(size));
}

// Every rank's `bytes`, in rank order, on every rank: lengths first, then the bytes padded to
// the longest (as int64 elements, which the process groups move).
std::vector<std::string> AllGatherBytes(ddp::ProcessGroup& group, const std::string& bytes) {
  std::vector<at::Tensor> lengths;
  for (int r = 0; r < group.size(); ++r) lengths.push_back(torch::empty({1}, at::kLong));
  group.AllGather(lengths, torch::tensor({static_cast<int64_t>(bytes.size())}))->Wait();
  int64_t longest = 1;
  for (const at::Tensor& length : lengths) longest = std::max(longest, length.item<int64_t>());
  at::Tensor mine = torch::zeros({(longest + 7) / 8}, at::kLong);
  std::memcpy(mine.data_ptr(), bytes.data(), bytes.size());
  std::vector<at::Tensor> all;
  for (int r = 0; r < group.size(); ++r) all.push_back(torch::empty_like(mine));
  group.AllGather(all, mine)->Wait();
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
//   setup    spec, threads, data, process group, model, optimizer, step plan
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
        spec_(CheckedSpec(user_spec, options)) {
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
    if (spec.distributed().backend() == v1::DistributedSpec::NCCL) {
      throw UserError("distributed.backend", "NCCL needs a GPU node; this trainer runs on CPU");
    }
    // Validation at submission cannot know where the ranks land; the trainer does.
    if (spec.precision() == v1::JobSpec::FP16) {
      throw UserError("precision",
                      "FP16 (autocast to float16 with dynamic loss scaling) needs a CUDA GPU; "
                      "this trainer runs on CPU: use BF16 (autocast to bfloat16) or FP32");
    }
    return spec;
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
    group_ = ddp::CreateProcessGroup(group_options);
    model_ = models::BuildModel(spec_.model(), dataset_->shape());
    module_ = model_->module();
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
      at::Tensor saves = torch::tensor({int64_t{leader_ && options_.checkpoints ? 1 : 0}});
      group_->Broadcast({saves}, 0)->Wait();
      checkpointing_ = saves.item<int64_t>() != 0;
    }
    std::optional<std::string> bytes;
    if (leader_ && options_.checkpoints) {
      if (std::optional<Checkpoint> latest = options_.checkpoints->LoadLatest()) {
        bytes = std::move(latest->bytes);
      }
    }
    bytes = BroadcastBytes(*group_, std::move(bytes));
    std::string rank_state;
    if (bytes) {
      step_ = RestoreState(*bytes, *module_, zero_ ? nullptr : optimizer_.get(), spec_,
                           options_.rank, &rank_state);
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
      RestoreRankState(rank_state, RankState());
    }
  }

  // --- step ---

  void RunEpoch() {
    const int64_t epoch = step_ / steps_per_epoch_;
    const int64_t first_micro = (step_ % steps_per_epoch_) * accumulation_;
    data::BatchLoader loader(*dataset_, sampler_->EpochIndices(epoch), batch_,
                             spec_.dataset().drop_last(), spec_.dataset().prefetch_batches(),
                             first_micro);
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
    double step_loss = 0;
    StepReport phases;  // this step's, summed over micro-batches
    at::Tensor x, y;
    // A local SGD step sends nothing: every micro-batch runs without gradient sync.
    const bool local = averager_ && !averager_->Synchronous(step_);
    for (int64_t micro = 0; micro < accumulation_; ++micro) {
      if (!loader.Next(&x, &y)) throw std::logic_error("data loader ended before the epoch");
      std::optional<ddp::DistributedDataParallel::NoSyncGuard> no_sync;
      if (local || micro + 1 < accumulation_) no_sync.emplace(ddp_.get());
      at::Tensor loss = ddp_->Forward([&] {
        PrecisionScope precision(spec_);
        return Loss(dataset_->shape().task, model_->Forward(x), y);
      });
      ddp_->Backward(loss / accumulation_);
      step_loss += loss.item<double>() / accumulation_;
      phases.forward_seconds += Seconds(ddp_->last_timings().forward);
      phases.backward_seconds += Seconds(ddp_->last_timings().backward);
      phases.allreduce_wait_seconds += Seconds(ddp_->last_timings().allreduce_wait);
    }
    if (!std::isfinite(step_loss)) {
      throw TrainingFailure("loss is " + std::to_string(step_loss) + " at step " +
                            std::to_string(step_) + " on rank " + std::to_string(options_.rank));
    }
    const auto optimizer_start = Clock::now();
    if (spec_.grad_clip_norm() > 0) {
      torch::nn::utils::clip_grad_norm_(module_->parameters(), spec_.grad_clip_norm());
    }
    const double lr = LearningRateAt(spec_, step_);
    // Parameters are float32: a larger step size cannot be applied, only diverge.
    if (!(std::abs(lr) <= std::numeric_limits<float>::max())) {
      throw TrainingFailure("learning rate " + std::to_string(lr) + " overflows float32 at step " +
                            std::to_string(step_));
    }
    SetLearningRate(LocalOptimizer(), lr);
    if (zero_) {
      zero_->Step();
    } else {
      optimizer_->step();
    }
    step_bytes_ = local ? 0 : ddp_->last_reduction().bytes;
    step_allreduce_seconds_ = local ? 0 : Seconds(ddp_->last_reduction().allreduce);
    if (averager_) step_bytes_ += averager_->AfterStep(step_);
    const auto step_end = Clock::now();
    ++step_;
    last_loss_ = step_loss;
    phases.optimizer_seconds = Seconds(step_end - optimizer_start);
    phases.step_seconds = Seconds(step_end - step_start);
    phases.learning_rate = lr;
    phases.loss = step_loss;
    AddToInterval(phases);
    if (options_.telemetry) StartStepTelemetry(phases);
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
    interval_.loss += step.loss;
    ++interval_.steps;
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
    at::Tensor mean_loss = torch::tensor({interval_.loss / interval_.steps}, at::kDouble);
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
    Emit(r, "progress");
    if (leader_) {
      log_ << "gradhub-trainer: step " << step_ << "/" << total_steps_ << " loss " << r.loss
           << " lr " << r.learning_rate << " " << static_cast<int64_t>(r.samples_per_second)
           << " samples/s\n";
    }
    interval_ = Interval();
  }

  void Emit(const StepReport& r, const std::string& event) {
    if (!leader_ || options_.progress == nullptr) return;
    JsonLine line;
    line.Add("event", event).Add("step", r.step).Add("totalSteps", total_steps_);
    if (r.eval_metrics.empty()) {
      line.Add("epoch", r.epoch).Add("loss", r.loss);
      line.Add("lr", r.learning_rate).Add("samplesPerSecond", r.samples_per_second);
      line.Add("forwardSeconds", r.forward_seconds).Add("backwardSeconds", r.backward_seconds);
      line.Add("allreduceWaitSeconds", r.allreduce_wait_seconds);
      line.Add("optimizerSeconds", r.optimizer_seconds).Add("stepSeconds", r.step_seconds);
      line.Add("allreduceBytes", r.allreduce_bytes);
    }
    for (const auto& [name, value] : r.eval_metrics) line.Add("eval." + name, value);
    *options_.progress << line.str() << std::endl;
  }

  // --- evaluate ---

  EvalResult EvaluateAndReport() {
    if (split_.validation.empty()) return EvalResult{};
    EvalResult eval =
        Evaluate(*model_, *dataset_, split_.validation, options_, *group_, batch_, spec_);
    step_telemetry_.eval_metrics = eval.metrics;
    StepReport r;
    r.step = step_;
    r.eval_metrics = eval.metrics;
    Emit(r, "eval");
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
      rank_states = AllGatherBytes(*group_, SerializeRankState(RankState()));
      last_checkpoint_step_ = step_;
    }
    if (!writer_) return false;
    std::string bytes =
        SerializeState(*module_, zero_ ? nullptr : optimizer_.get(), step_, spec_, rank_states);
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
    // Every rank reports its end state, so a launcher can tell the ranks agree.
    if (options_.progress) {
      JsonLine line;
      line.Add("event", std::string("done")).Add("rank", int64_t{options_.rank}).Add("step", step_);
      line.Add("totalSteps", total_steps_);
      line.Add("loss", last_loss_).Add("trainSeconds", loop_seconds_);
      line.Add("allreduceBytes", run_allreduce_bytes_)
          .Add("allreduceSeconds", run_allreduce_seconds_);
      line.Add("optimizerStateBytes", ddp::OptimizerStateBytes(LocalOptimizer()));
      line.Add("busBandwidthBytesPerSecond",
               BusBandwidth(run_allreduce_bytes_, run_allreduce_seconds_, options_.world_size));
      for (const auto& [name, value] : result.eval_metrics) line.Add("eval." + name, value);
      if (writer_) {
        line.Add("checkpoints", checkpoints_saved_).Add("checkpointBytes", checkpoint_bytes_);
        line.Add("checkpointSnapshotSeconds", checkpoint_snapshot_seconds_);
        line.Add("checkpointWaitSeconds", checkpoint_wait_seconds_);
      }
      line.Add("parametersSha256", result.parameters_sha256);
      *options_.progress << line.str() << std::endl;
    }
    return result;
  }

  const TrainerOptions& options_;
  std::ostream& log_;
  const bool leader_;
  const v1::JobSpec spec_;  // with defaults, world size as launched

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
  double last_loss_ = 0;
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
