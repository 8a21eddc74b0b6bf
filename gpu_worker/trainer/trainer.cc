#include "gpu_worker/trainer/trainer.h"

#include <dlfcn.h>
#include <torch/torch.h>

#include <cmath>
#include <iomanip>
#include <iostream>
#include <limits>
#include <sstream>
#include <thread>

#include "gpu_worker/common/user_error.h"
#include "gpu_worker/data/batch_loader.h"
#include "gpu_worker/data/dataset.h"
#include "gpu_worker/data/sampler.h"
#include "gpu_worker/ddp/distributed_data_parallel.h"
#include "gpu_worker/models/model.h"
#include "gpu_worker/trainer/job_spec.h"
#include "gpu_worker/trainer/optimization.h"
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
    return Raw(key, "\"" + value + "\"");  // our own identifiers and hex digests only
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

// Everything a resumed run needs to continue bit for bit: weights and buffers, optimizer
// state (momentum) and the step. Data order and random numbers are functions of the step.
std::string SaveState(torch::nn::Module& module, torch::optim::Optimizer& optimizer,
                      int64_t step) {
  torch::serialize::OutputArchive archive, model_archive, optimizer_archive;
  module.save(model_archive);
  optimizer.save(optimizer_archive);
  archive.write("model", model_archive);
  archive.write("optimizer", optimizer_archive);
  archive.write("step", torch::tensor(step));
  std::ostringstream out;
  archive.save_to(out);
  return out.str();
}

int64_t LoadState(const std::string& bytes, torch::nn::Module& module,
                  torch::optim::Optimizer& optimizer) {
  torch::serialize::InputArchive archive, model_archive, optimizer_archive;
  std::istringstream in(bytes);
  archive.load_from(in);
  archive.read("model", model_archive);
  archive.read("optimizer", optimizer_archive);
  module.load(model_archive);
  optimizer.load(optimizer_archive);
  at::Tensor step;
  archive.read("step", step);
  return step.item<int64_t>();
}

struct EvalResult {
  double loss = 0;
  std::map<std::string, double> metrics;
};

// Each rank evaluates every world_size-th validation example; sums are reduced so every
// rank reports the same numbers.
EvalResult Evaluate(models::Model& model, const data::Dataset& dataset,
                    const std::vector<int64_t>& validation, const TrainerOptions& options,
                    ddp::ProcessGroup& group, int64_t batch_size) {
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
  if (dataset.shape().task == Task::kLanguageModel) result.metrics["perplexity"] = std::exp(result.loss);
  return result;
}

}  // namespace

TrainResult Train(const v1::JobSpec& user_spec, const TrainerOptions& options) {
  std::ostream& log = options.log ? *options.log : std::cerr;
  const bool leader = options.rank == 0;
  CheckJobSpec(user_spec);
  const v1::JobSpec spec = WithDefaults(user_spec);
  // A spec that leaves worldSize unset runs at whatever size it is launched with, as torchrun.
  if (user_spec.distributed().world_size() != 0 &&
      user_spec.distributed().world_size() != options.world_size) {
    throw UserError("distributed.worldSize",
                    std::to_string(spec.distributed().world_size()) + " but the trainer runs " +
                        std::to_string(options.world_size) + " ranks");
  }
  if (spec.distributed().backend() == v1::DistributedSpec::NCCL) {
    throw UserError("distributed.backend", "NCCL needs a GPU node; this trainer runs on CPU");
  }
  const int threads =
      options.threads > 0
          ? options.threads
          : std::max(1, static_cast<int>(std::thread::hardware_concurrency()) /
                            std::max(1, options.local_world_size));
  at::set_num_threads(threads);
  LimitBlasThreads(threads);
  at::manual_seed(spec.seed());

  const int64_t context = spec.model().has_transformer() ? spec.model().transformer().context_length() : 0;
  std::unique_ptr<data::Dataset> dataset = data::LoadDataset(spec.dataset(), spec.seed(), context);
  const data::Split split =
      data::SplitIndices(dataset->size(), spec.dataset().validation_fraction(), spec.seed());
  dataset->Normalize(split.train);

  ddp::ProcessGroupOptions group_options;
  group_options.rank = options.rank;
  group_options.size = options.world_size;
  group_options.store = options.store;
  group_options.timeout = options.collective_timeout;
  std::shared_ptr<ddp::ProcessGroup> group = ddp::CreateProcessGroup(group_options);

  std::unique_ptr<models::Model> model = models::BuildModel(spec.model(), dataset->shape());
  std::shared_ptr<torch::nn::Module> module = model->module();
  module->train();
  std::unique_ptr<torch::optim::Optimizer> optimizer =
      BuildOptimizer(spec.optimizer(), module->parameters());

  TrainResult result;
  int64_t step = 0;
  if (options.checkpoints) {
    if (std::optional<Checkpoint> checkpoint = options.checkpoints->LoadLatest()) {
      step = LoadState(checkpoint->bytes, *module, *optimizer);
      result.resumed_from_step = step;
      log << "gradhub-trainer: rank " << options.rank << " resumed from step " << step << "\n";
    }
  }

  ddp::DdpOptions ddp_options;
  ddp_options.reducer.bucket_cap_bytes =
      static_cast<int64_t>(spec.distributed().bucket_cap_mb() * (1 << 20));
  ddp_options.reducer.find_unused_parameters = spec.distributed().find_unused_parameters();
  switch (spec.distributed().comm_hook()) {
    case v1::DistributedSpec::FP16:
      ddp_options.reducer.comm_hook = ddp::CommHook::kFp16;
      break;
    case v1::DistributedSpec::BF16:
      ddp_options.reducer.comm_hook = ddp::CommHook::kBf16;
      break;
    default:
      break;
  }
  ddp::DistributedDataParallel ddp(module, group, ddp_options);

  const int64_t batch = spec.batch_size_per_rank();
  const int64_t accumulation = spec.grad_accumulation_steps();
  const bool drop_last = spec.dataset().drop_last();
  data::DistributedSampler sampler(split.train, options.world_size, options.rank, spec.seed(),
                                   /*shuffle=*/true, drop_last);
  const int64_t micro_per_epoch =
      drop_last ? sampler.per_rank() / batch : (sampler.per_rank() + batch - 1) / batch;
  const int64_t steps_per_epoch = micro_per_epoch / accumulation;
  if (steps_per_epoch == 0) {
    throw UserError("batchSizePerRank",
                    std::to_string(batch) + " x " + std::to_string(accumulation) +
                        " micro-batches exceed the " + std::to_string(sampler.per_rank()) +
                        " training examples of each rank");
  }
  int64_t total_steps = spec.max_steps();
  if (spec.max_epochs() > 0) {
    const int64_t by_epochs = spec.max_epochs() * steps_per_epoch;
    total_steps = total_steps > 0 ? std::min(total_steps, by_epochs) : by_epochs;
  }
  if (leader) {
    log << "gradhub-trainer: " << model->Describe() << "; " << split.train.size() << " train / "
        << split.validation.size() << " validation examples; " << total_steps << " steps of "
        << batch * accumulation * options.world_size << " samples\n";
  }

  auto report = [&](const StepReport& r, const std::string& event) {
    if (options.telemetry) options.telemetry->Report(r);
    if (!leader || options.progress == nullptr) return;
    JsonLine line;
    line.Add("event", event).Add("step", r.step);
    if (r.eval_metrics.empty()) {
      line.Add("epoch", r.epoch).Add("loss", r.loss);
      line.Add("lr", r.learning_rate).Add("samplesPerSecond", r.samples_per_second);
      line.Add("forwardSeconds", r.forward_seconds).Add("backwardSeconds", r.backward_seconds);
      line.Add("allreduceWaitSeconds", r.allreduce_wait_seconds);
      line.Add("optimizerSeconds", r.optimizer_seconds).Add("stepSeconds", r.step_seconds);
      line.Add("allreduceBytes", r.allreduce_bytes);
    }
    for (const auto& [name, value] : r.eval_metrics) line.Add("eval." + name, value);
    *options.progress << line.str() << std::endl;
  };
  auto evaluate_and_report = [&](int64_t at_step, StepReport r) {
    if (split.validation.empty()) return EvalResult{};
    EvalResult eval = Evaluate(*model, *dataset, split.validation, options, *group, batch);
    r.step = at_step;
    r.eval_metrics = eval.metrics;
    report(r, "eval");
    if (leader) {
      log << "gradhub-trainer: step " << at_step << " validation";
      for (const auto& [name, value] : eval.metrics) log << " " << name << " " << value;
      log << "\n";
    }
    return eval;
  };

  // Interval accumulators for the progress line.
  StepReport interval;
  double interval_loss = 0;
  int64_t interval_steps = 0;
  auto interval_start = Clock::now();
  double last_loss = 0;
  EvalResult last_eval;

  while (step < total_steps) {
    const int64_t epoch = step / steps_per_epoch;
    const int64_t first_micro = (step % steps_per_epoch) * accumulation;
    data::BatchLoader loader(*dataset, sampler.EpochIndices(epoch), batch, drop_last,
                             spec.dataset().prefetch_batches(), first_micro);
    at::Tensor x, y;
    for (int64_t in_epoch = step % steps_per_epoch; in_epoch < steps_per_epoch && step < total_steps;
         ++in_epoch) {
      const auto step_start = Clock::now();
      at::manual_seed(StepSeed(spec.seed(), options.rank, step));
      ddp.ZeroGrad();
      double step_loss = 0;
      StepReport timings;
      for (int64_t micro = 0; micro < accumulation; ++micro) {
        if (!loader.Next(&x, &y)) throw std::logic_error("data loader ended before the epoch");
        auto run = [&] {
          at::Tensor loss = ddp.Forward([&] { return Loss(dataset->shape().task, model->Forward(x), y); });
          ddp.Backward(loss / accumulation);
          step_loss += loss.item<double>() / accumulation;
          timings.forward_seconds += Seconds(ddp.last_timings().forward);
          timings.backward_seconds += Seconds(ddp.last_timings().backward);
          timings.allreduce_wait_seconds += Seconds(ddp.last_timings().allreduce_wait);
        };
        if (micro + 1 < accumulation) {
          auto no_sync = ddp.NoSync();
          run();
        } else {
          run();
        }
      }
      if (!std::isfinite(step_loss)) {
        throw TrainingFailure("loss is " + std::to_string(step_loss) + " at step " +
                              std::to_string(step) + " on rank " + std::to_string(options.rank));
      }
      const auto optimizer_start = Clock::now();
      if (spec.grad_clip_norm() > 0) {
        torch::nn::utils::clip_grad_norm_(module->parameters(), spec.grad_clip_norm());
      }
      const double lr = LearningRateAt(spec, step);
      // Parameters are float32: a larger step size cannot be applied, only diverge.
      if (!(std::abs(lr) <= std::numeric_limits<float>::max())) {
        throw TrainingFailure("learning rate " + std::to_string(lr) + " overflows float32 at step " +
                              std::to_string(step));
      }
      SetLearningRate(*optimizer, lr);
      optimizer->step();
      const auto step_end = Clock::now();
      ++step;
      last_loss = step_loss;

      interval.forward_seconds += timings.forward_seconds;
      interval.backward_seconds += timings.backward_seconds;
      interval.allreduce_wait_seconds += timings.allreduce_wait_seconds;
      interval.optimizer_seconds += Seconds(step_end - optimizer_start);
      interval.step_seconds += Seconds(step_end - step_start);
      interval.allreduce_bytes = ddp.last_reduction().bytes;
      interval.buckets = ddp.last_reduction().buckets;
      interval.learning_rate = lr;
      interval_loss += step_loss;
      ++interval_steps;

      const bool last = step == total_steps;
      if (step % spec.log_every_steps() == 0 || last) {
        // The loss of all ranks, not only rank 0's shard.
        at::Tensor mean_loss = torch::tensor({interval_loss / interval_steps}, at::kDouble);
        group->AllReduce(mean_loss, ddp::ReduceOp::kAverage)->Wait();
        const double elapsed = Seconds(Clock::now() - interval_start);
        StepReport r = interval;
        for (double* value : {&r.forward_seconds, &r.backward_seconds, &r.allreduce_wait_seconds,
                              &r.optimizer_seconds, &r.step_seconds}) {
          *value /= interval_steps;
        }
        r.step = step;
        r.epoch = (step - 1) / steps_per_epoch;
        r.loss = mean_loss.item<double>();
        r.samples_per_second =
            elapsed > 0 ? interval_steps * batch * accumulation * options.world_size / elapsed : 0;
        report(r, "progress");
        if (leader) {
          log << "gradhub-trainer: step " << step << "/" << total_steps << " loss " << r.loss
              << " lr " << lr << " " << static_cast<int64_t>(r.samples_per_second)
              << " samples/s\n";
        }
        interval = StepReport();
        interval_loss = 0;
        interval_steps = 0;
        interval_start = Clock::now();
      }
      if (spec.eval_every_steps() > 0 && step % spec.eval_every_steps() == 0 && !last) {
        last_eval = evaluate_and_report(step, StepReport());
      }
      const int64_t every = spec.checkpoint().every_steps();
      if (options.checkpoints && leader && ((every > 0 && step % every == 0) || last)) {
        options.checkpoints->Save({step, SaveState(*module, *optimizer, step)});
      }
    }
  }

  last_eval = evaluate_and_report(step, StepReport());
  result.steps = step;
  result.final_loss = last_loss;
  result.eval_metrics = last_eval.metrics;
  result.parameters_sha256 = ParametersSha256(*module);
  // Every rank reports its end state, so a launcher can tell the ranks agree.
  if (options.progress) {
    JsonLine line;
    line.Add("event", std::string("done")).Add("rank", int64_t{options.rank}).Add("step", step).Add("loss", last_loss);
    for (const auto& [name, value] : result.eval_metrics) line.Add("eval." + name, value);
    line.Add("parametersSha256", result.parameters_sha256);
    *options.progress << line.str() << std::endl;
  }
  return result;
}

}  // namespace gradhub::trainer
