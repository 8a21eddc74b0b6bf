#include "gpu_worker/trainer/trainer.h"

#include <dlfcn.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <thread>

#include "gpu_worker/data/batch_loader.h"
#include "gpu_worker/data/dataset.h"
#include "gpu_worker/data/sampler.h"
#include "gpu_worker/trainer/checkpointer.h"
#include "gpu_worker/trainer/data_parallel_pass.h"
#include "gpu_worker/trainer/forward_pass.h"
#include "gpu_worker/trainer/loss_reader.h"
#include "gpu_worker/trainer/pipeline_training.h"
#include "gpu_worker/trainer/progress_reporter.h"
#include "gpu_worker/trainer/rank_model.h"
#include "gpu_worker/trainer/training_plan.h"
#include "gpu_worker/trainer/update_rule.h"
#include "services/common/contract/user_error.h"
#include "services/common/sha256.h"

namespace gradhub::trainer {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(std::chrono::nanoseconds duration) {
  return std::chrono::duration<double>(duration).count();
}

std::ostream& LogOf(const TrainerOptions& options) {
  return options.log ? *options.log : std::cerr;
}

// at::set_num_threads does not reach OpenBLAS's own thread pool (Debian's libtorch links the
// pthreads build), so ranks sharing a machine would each run a BLAS thread per core and spin
// against each other in sched_yield. Set it too, when OpenBLAS is the BLAS in this process.
void LimitBlasThreads(int threads) {
  using SetThreads = void (*)(int);
  if (auto set = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) {
    set(threads);
  }
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

std::string ParametersSha256(torch::nn::Module& module) {
  std::string bytes;
  for (const at::Tensor& parameter : module.parameters()) {
    at::Tensor cpu = parameter.detach().to(at::kCPU).contiguous();
    bytes.append(static_cast<const char*>(cpu.data_ptr()), cpu.numel() * cpu.element_size());
  }
  return Sha256Hex(bytes);
}

LaunchFacts LaunchOf(const TrainerOptions& options) {
  LaunchFacts launch;
  launch.rank = options.rank;
  launch.world_size = options.world_size;
  launch.local_world_size = options.local_world_size;
  launch.threads = options.threads;
  launch.hardware_threads = static_cast<int>(std::thread::hardware_concurrency());
  launch.device = options.device;
  launch.backend = options.backend;
  launch.telemetry = options.telemetry != nullptr;
  launch.fp16_on_cpu_for_test = options.fp16_scaling_on_cpu_for_test.has_value();
  return launch;
}

// The plan's placement on this process's devices: the CPU, or the rank's GPU. That GPU is
// cuda:0 under the agent (CUDA_VISIBLE_DEVICES shows the rank its GPU alone); by hand on a
// machine with several, the local rank's, as torchrun does. Throws DeviceUnavailable when the
// node said there is a GPU and this process can use none.
c10::Device TrainingDevice(const PlacementPlan& placement, int local_rank) {
  if (!placement.cuda) return c10::kCPU;
  if (!torch::cuda::is_available()) {
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    throw DeviceUnavailable(
        std::string("this rank was given a GPU (GRADHUB_DEVICE=cuda, CUDA_VISIBLE_DEVICES=") +
        (visible ? visible : "unset") +
        ") but can use none: a libtorch without CUDA, no NVIDIA driver, or no such device");
  }
  const int64_t visible = static_cast<int64_t>(torch::cuda::device_count());
  return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(local_rank % visible));
}

// The rank's process group. NCCL: the engine's group, with its own collective timeout and
// abort of a communicator whose peer died (gpu_worker/ddp/comm/nccl), on this rank's GPU.
// Gloo: distributed.encryptTraffic seals its traffic; NCCL cannot, so a spec that asks for it
// where AUTO became NCCL is refused here rather than run in the clear.
ddp::ProcessGroupOptions ProcessGroupOptionsFor(const TrainingPlan& plan,
                                                const TrainerOptions& options,
                                                const c10::Device& device) {
  ddp::ProcessGroupOptions group;
  group.rank = plan.rank;
  group.size = plan.world_size;
  group.store = options.store;
  group.timeout = options.collective_timeout;
  const bool encrypt = plan.spec.distributed().encrypt_traffic();
  if (plan.placement.backend == v1::DistributedSpec::NCCL) {
    if (encrypt) {
      throw UserError("distributed.encryptTraffic",
                      "this rank's backend is NCCL (AUTO on a CUDA node), which has no encrypted "
                      "transport: set backend GLOO or leave encryptTraffic out");
    }
    group.backend = ddp::Backend::kNccl;
    group.nccl = ddp::NcclOptions{device.index()};
  } else {
    ddp::GlooOptions& gloo = group.gloo.emplace();
    gloo.encrypt_traffic = encrypt;
    gloo.hostname = options.listen_address;
  }
  return group;
}

// GradScaler's defaults on a GPU; on the CPU (tests only) the test's.
ddp::LossScalerOptions LossScalerOptionsFor(const TrainingPlan& plan,
                                            const TrainerOptions& options) {
  if (plan.placement.cuda || !options.fp16_scaling_on_cpu_for_test) return {};
  return *options.fp16_scaling_on_cpu_for_test;
}

ReportOutputs ReportOutputsOf(const TrainerOptions& options) {
  return ReportOutputs{options.progress, options.log, options.telemetry};
}

// What a rank trains on: the examples, their split, and its shard of the training split (its
// replica's: a pipeline's stages share their samples).
struct TrainingData {
  std::unique_ptr<data::Dataset> dataset;
  data::Split split;
  std::unique_ptr<data::DistributedSampler> sampler;
};

TrainingData LoadTrainingData(const v1::JobSpec& spec, const PipelinePlan& pipeline) {
  TrainingData data;
  const int64_t context =
      spec.model().has_transformer() ? spec.model().transformer().context_length() : 0;
  data.dataset = data::LoadDataset(spec.dataset(), spec.seed(), context);
  data.split =
      data::SplitIndices(data.dataset->size(), spec.dataset().validation_fraction(), spec.seed());
  data.dataset->Normalize(data.split.train);
  data.sampler = std::make_unique<data::DistributedSampler>(
      data.split.train, pipeline.replicas, pipeline.replica, spec.seed(), /*shuffle=*/true,
      spec.dataset().drop_last());
  return data;
}

// What a rank settles before it joins its group, in this order, so that each step's errors
// come before the next step's work:
//   1. the spec's rules that need no data (SpecAsLaunched, PlanPipeline: UserError);
//   2. its device (DeviceUnavailable);
//   3. its threads, and the seed that data synthesis and weight initialization draw from;
//   4. the data;
//   5. the plan, which needs the count of training examples (UserError: batch too large).
struct RankStart {
  TrainingPlan plan;
  c10::Device device;
  TrainingData data;
};

RankStart StartRank(const v1::JobSpec& user_spec, const TrainerOptions& options) {
  LaunchFacts launch = LaunchOf(options);
  const v1::JobSpec spec = SpecAsLaunched(user_spec, launch);
  const PipelinePlan pipeline = PlanPipeline(spec, launch);
  const PlacementPlan placement = PlaceRank(spec, launch);
  const c10::Device device = TrainingDevice(placement, options.local_rank);
  LogOf(options) << "gradhub-trainer: rank " << options.rank << " trains on " << device.str()
                 << " with " << (placement.backend == v1::DistributedSpec::NCCL ? "NCCL" : "Gloo")
                 << "\n";
  const int threads = IntraOpThreads(launch);
  at::set_num_threads(threads);
  LimitBlasThreads(threads);
  at::manual_seed(spec.seed());
  TrainingData data = LoadTrainingData(spec, pipeline);
  launch.train_examples = static_cast<int64_t>(data.split.train.size());
  TrainingPlan plan = PlanTraining(user_spec, launch);
  if (data.sampler->per_rank() != plan.batches.examples_per_rank) {
    throw std::logic_error("the plan's examples per rank differ from the sampler's");
  }
  return RankStart{std::move(plan), device, std::move(data)};
}

// The inputs of the rank's first training micro-batch (what MEASURED_TIME balance measures).
at::Tensor FirstMicroBatch(const TrainingPlan& plan, const TrainingData& data) {
  std::vector<int64_t> indices = data.sampler->EpochIndices(0);
  const int64_t rows = plan.batches.per_rank / std::max(1, plan.pipeline.micro_batches);
  indices.resize(static_cast<size_t>(std::min<int64_t>(rows, indices.size())));
  at::Tensor x, y;
  data.dataset->Batch(indices, &x, &y);
  return x;
}

// SIGTERM as TrainerOptions::stop_requested reports it, and since when.
class StopRequest {
 public:
  StopRequest(const std::atomic<bool>* flag, std::chrono::milliseconds grace,
              std::function<void()> on_loop_start)
      : flag_(flag), grace_(grace), on_loop_start_(std::move(on_loop_start)) {}

  // From here on a stop is the loop's to handle (TrainerOptions::on_loop_start).
  void LoopStarts() const {
    if (on_loop_start_) on_loop_start_();
  }

  bool requested() {
    if (flag_ == nullptr || !flag_->load()) return false;
    if (!seen_) seen_ = Clock::now();
    return true;
  }
  std::chrono::milliseconds grace() const { return grace_; }
  bool grace_over() const { return seen_ && Clock::now() - *seen_ > grace_; }

 private:
  const std::atomic<bool>* const flag_;
  const std::chrono::milliseconds grace_;
  const std::function<void()> on_loop_start_;
  std::optional<Clock::time_point> seen_;
};

// One rank's training run: the loop. The constructor sets up (StartRank, then the group, the
// model (a pipeline's rank: its stage's), the update rule and the parts that report and
// checkpoint); Run() resumes, then steps until the end:
//   resume   Checkpointer::Load, then the gradient pass over the restored model: data
//            parallel (DDP over every rank) or pipelined (gradient_pass.h)
//   step     the pass's forward/backward over the micro-batches, then the update rule's step
//   report   a progress record at Cadence::LogsAt (loss averaged over ranks)
//   evaluate at Cadence::EvaluatesAt, the last step's in Finish
//   checkpoint  at Cadence::CheckpointsAt; uploads run on a background thread, and a checkpoint
//            that comes due while the previous upload is still going out is skipped (the
//            last step's and a stop's wait for it)
//   preempt  on a stop request rank 0 saves the last finished step and leaves
class TrainingRun {
 public:
  TrainingRun(const v1::JobSpec& user_spec, const TrainerOptions& options)
      : TrainingRun(StartRank(user_spec, options), options) {}

  TrainResult Run() {
    Resume();
    stop_.LoopStarts();
    progress_.StartLoop();  // throughput counts from the first step, not from setup
    const auto loop_start = Clock::now();
    while (step_ < plan_.batches.total_steps) RunEpoch();
    return Finish(Seconds(Clock::now() - loop_start));
  }

 private:
  TrainingRun(RankStart start, const TrainerOptions& options)
      : plan_(std::move(start.plan)),
        device_(start.device),
        data_(std::move(start.data)),
        group_options_(ProcessGroupOptionsFor(plan_, options, device_)),
        group_(ddp::CreateProcessGroup(group_options_)),
        latest_checkpoint_(plan_.leader() ? options.checkpoints : nullptr),
        model_(BuildRankModel(
            plan_, *data_.dataset, *group_, [this] { return FirstMicroBatch(plan_, data_); },
            RecordedLayerCosts(plan_, latest_checkpoint_), device_, LogOf(options))),
        rule_(model_.module, group_, plan_, LossScalerOptionsFor(plan_, options)),
        progress_(plan_, ReportOutputsOf(options), group_, device_),
        checkpoints_(plan_, options.checkpoints, latest_checkpoint_, progress_.log(), group_,
                     device_, model_, rule_, options.scratch_dir),
        losses_(plan_.rank),
        stop_(options.stop_requested, options.preempt_grace, options.on_loop_start),
        parameters_dump_dir_(options.parameters_dump_dir) {
    progress_.LogStart(model_.description, static_cast<int64_t>(data_.split.train.size()),
                       static_cast<int64_t>(data_.split.validation.size()));
  }

  void Resume() {
    const std::optional<Checkpointer::Resumed> resumed = checkpoints_.Load();
    if (resumed) {
      step_ = resumed->step;
      progress_.log() << "gradhub-trainer: rank " << plan_.rank << " resumed from step " << step_
                      << "\n";
    }
    const PassContext context{plan_, *data_.dataset, device_, model_, rule_, group_};
    if (plan_.pipeline.enabled()) {
      pass_ = std::make_unique<PipelinePass>(context, group_options_);
    } else {
      pass_ = std::make_unique<DataParallelPass>(context);
    }
    // After DDP's broadcast of rank 0's parameters: a local SGD replica gets its own back.
    if (resumed && plan_.per_rank_state) {
      rule_.RestoreRankState(resumed->rank_state, step_, device_);
    }
  }

  void RunEpoch() {
    const BatchPlan& batches = plan_.batches;
    const v1::DatasetSpec& dataset = plan_.spec.dataset();
    const int64_t in_epoch = step_ % batches.steps_per_epoch;
    data::BatchLoader loader(*data_.dataset,
                             data_.sampler->EpochIndices(step_ / batches.steps_per_epoch),
                             batches.per_rank, dataset.drop_last(), dataset.prefetch_batches(),
                             /*start_batch=*/in_epoch * batches.accumulation,
                             /*pin_memory=*/device_.is_cuda());
    for (int64_t i = in_epoch; i < batches.steps_per_epoch && step_ < batches.total_steps; ++i) {
      RunStep(loader);
      if (step_ == batches.total_steps) {
        AfterLastStep();
        break;
      }
      AfterStep();
    }
  }

  // One optimizer step: the gradient pass's micro-batches, the loss read back where the
  // cadence says, the update rule's step. Reports its timings.
  void RunStep(data::BatchLoader& loader) {
    const auto step_start = Clock::now();
    at::manual_seed(StepSeed(plan_.spec.seed(), plan_.rank, step_));
    pass_->ZeroGrad();
    StepReport report;  // this step's, phases summed over micro-batches
    losses_.Take(pass_->Run(loader, rule_.SyncsGradients(step_), report));
    if (plan_.cadence.ReadsLossAt(step_ + 1)) progress_.AddLoss(losses_.Read(step_));
    const auto optimizer_start = Clock::now();
    const StepOutcome outcome = rule_.Step(step_);
    if (outcome.skipped) progress_.ReportSkippedStep(step_ + 1, *rule_.loss_scale());
    // What the step sent: its gradients (none for a local step) plus a parameter average.
    report.allreduce_bytes += outcome.averaged_bytes;
    const auto step_end = Clock::now();
    report.step = ++step_;
    report.optimizer_seconds = Seconds(step_end - optimizer_start);
    report.step_seconds = Seconds(step_end - step_start);
    report.learning_rate = outcome.learning_rate;
    report.loss = losses_.last();  // read at this step: ReadsLossAt is true with telemetry
    progress_.AddStep(report);
  }

  // Reports, evaluates and checkpoints the step just done where the cadence says, sends its
  // telemetry, then stops if asked to.
  void AfterStep() {
    const Cadence& cadence = plan_.cadence;
    if (cadence.LogsAt(step_)) progress_.ReportInterval(step_, rule_.loss_scale());
    if (cadence.EvaluatesAt(step_)) EvaluateAndReport();
    if (cadence.CheckpointsAt(step_)) SaveCheckpoint(SaveReason::kPeriodic);
    progress_.SendStepTelemetry();
    StopIfRequested();
  }

  // The last step reports and checkpoints; Finish evaluates and sends its telemetry.
  void AfterLastStep() {
    progress_.ReportInterval(step_, rule_.loss_scale());
    SaveCheckpoint(SaveReason::kFinal);
  }

  EvalResult EvaluateAndReport() {
    if (data_.split.validation.empty()) return EvalResult{};
    EvalResult eval = pass_->Evaluate(data_.split.validation);
    progress_.ReportEval(step_, eval);
    return eval;
  }

  void SaveCheckpoint(SaveReason reason) {
    const SaveReport report = checkpoints_.Save(step_, reason);
    if (report.seconds) progress_.ReportCheckpointSave(*report.seconds);
    if (report.skipped) progress_.ReportCheckpointSkipped(step_, *report.skipped);
  }

  // Rank 0 finishes its step, saves, waits up to the grace for the commit and throws
  // Preempted. Other ranks keep training until rank 0 has gone (their next collective fails)
  // or the grace has passed.
  void StopIfRequested() {
    if (!stop_.requested()) return;
    if (!plan_.leader()) {
      if (stop_.grace_over()) throw Preempted("stopped after step " + std::to_string(step_));
      return;
    }
    // A GPU may hold unread losses: never save a model that went NaN.
    progress_.AddLoss(losses_.Read(step_ - 1));
    checkpoints_.Save(step_, SaveReason::kStop);
    throw Preempted("stopped after step " + std::to_string(step_) + "; " + CommitForStop());
  }

  // Rank 0 on a stop request: waits for its last checkpoint, and says which it is.
  std::string CommitForStop() {
    if (!checkpoints_.has_store()) return "no checkpoint store";
    try {
      checkpoints_.Flush(stop_.grace());
    } catch (const std::runtime_error& error) {  // e.g. refused: the job was cancelled
      return std::string("no checkpoint: ") + error.what();
    }
    if (checkpoints_.last_saved_step() == step_) {
      return "checkpoint of step " + std::to_string(step_) + " committed";
    }
    return "checkpoint of step " + std::to_string(checkpoints_.last_saved_step()) +
           " is the latest: per-rank state (shardOptimizerState, localSgd, POWER_SGD) and "
           "pipeline stages' state are gathered only at checkpoint.everySteps and at the end";
  }

  TrainResult Finish(double loop_seconds) {
    const EvalResult eval = EvaluateAndReport();
    if (checkpoints_.resumed_from_step() != step_) progress_.SendStepTelemetry();
    checkpoints_.Flush(std::chrono::hours(24));
    TrainResult result;
    result.steps = step_;
    result.resumed_from_step = checkpoints_.resumed_from_step();
    result.final_loss = losses_.last();
    result.eval_metrics = eval.metrics;
    result.parameters_sha256 = ParametersSha256(*model_.module);
    if (!parameters_dump_dir_.empty()) {
      DumpParameters(model_, parameters_dump_dir_ + "/rank-" + std::to_string(plan_.rank) + ".txt");
    }
    const CheckpointTotals& saved = checkpoints_.totals();
    result.checkpoints_saved = saved.saved;
    result.checkpoints_skipped = saved.skipped;
    result.checkpoint_snapshot_seconds = saved.snapshot_seconds;
    result.checkpoint_wait_seconds = saved.wait_seconds;
    DoneFacts facts;
    facts.train_seconds = loop_seconds;
    facts.optimizer_state_bytes = rule_.optimizer_state_bytes();
    facts.loss_scale = rule_.loss_scale();
    if (facts.loss_scale) {
      result.skipped_steps = facts.loss_scale->skipped_steps;
      result.loss_scale = facts.loss_scale->scale;
    }
    if (checkpoints_.has_store()) facts.checkpoints = saved;
    progress_.ReportDone(result, facts);
    return result;
  }

  const TrainingPlan plan_;
  const c10::Device device_;
  const TrainingData data_;
  const ddp::ProcessGroupOptions group_options_;  // the world group's, for its subgroups
  const std::shared_ptr<ddp::ProcessGroup> group_;
  LatestCheckpoint latest_checkpoint_;  // rank 0's, read before the model when its split needs it
  const RankModel model_;
  UpdateRule rule_;
  std::unique_ptr<GradientPass> pass_;  // forward, backward and gradient sync, built at resume
  ProgressReporter progress_;
  Checkpointer checkpoints_;
  LossReader losses_;
  StopRequest stop_;
  const std::string parameters_dump_dir_;
  int64_t step_ = 0;  // optimizer steps done
};

}  // namespace

TrainResult Train(const v1::JobSpec& spec, const TrainerOptions& options) {
  return TrainingRun(spec, options).Run();
}

}  // namespace gradhub::trainer
