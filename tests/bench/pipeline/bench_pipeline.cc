// Pipeline model parallelism (issue 33) against its theory and against data parallelism: one
// run of S stages x D replicas, every rank a process on this host over a FileStore and Gloo,
// one thread each (at::set_num_threads(1); run.sh sets OPENBLAS_NUM_THREADS=1).
//
// The model is LAYERS identical Linear(W, W) + ReLU layers (W = GRADHUB_BENCH_WIDTH, 1024),
// cut into S stages of LAYERS / S layers each, so the stages are balanced; with the
// interleaved schedule each stage holds 2 chunks of half its layers. The loss is cross entropy
// over the W outputs. BATCH is the global batch: each replica's BATCH / D samples are cut into
// M micro-batches. S = 1 is the data-parallel reference: the whole model in one
// DistributedDataParallel over D ranks, no PipelineStage, BATCH / D samples per rank.
//
// With GRADHUB_BENCH_SLEEP_MS=T each layer also sleeps T ms in its forward and 2T ms in its
// backward (SleepFunction): stages balanced by construction whose "compute" needs no core, so
// the bubble of the schedule and the engine is measured even with more ranks than cores
// (pair it with a small W, whose GEMMs then cost little).
//
// Prints one line, measured over the timed steps (the first STEPS / 5 are warm-up):
//   <median step seconds of rank 0> <ideal bubble> <bubble of each stage, comma-separated>
//   <peak activation bytes of each stage, comma-separated>
// where a stage's bubble is the mean of its ranks' StageStepReport::bubble_fraction (the share
// of the step it did not spend computing its forwards and backwards: waiting for its
// neighbours, and the messages and the engine's own work) and its peak the most any of its
// ranks reported. With S = 1 the last three are "-". GRADHUB_BENCH_VERBOSE=1 also prints every
// rank's report of every step on stderr (where the time went).
//
// Usage: bench_pipeline SCHEDULE STAGES REPLICAS MICRO_BATCHES LAYERS BATCH STEPS
//        SCHEDULE: gpipe | 1f1b | 1f1b-deep (its deep warm-up, what the trainer runs on CPU
//        ranks) | interleaved
//        bench_pipeline pingpong ROUNDS [NUMEL]
// pingpong: two ranks pass NUMEL floats (8) back and forth with ProcessGroup::Send and Recv
// (what the stages' messages go through); prints the median and the mean round trip in seconds
// over ROUNDS rounds after as many warm-up rounds, as pytorch_pingpong.py does for PyTorch's
// gloo.
#include <sys/wait.h>
#include <unistd.h>

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "gpu_worker/ddp/comm/process_group.h"
#include "gpu_worker/ddp/distributed_data_parallel.h"
#include "gpu_worker/ddp/pipeline/pipeline_stage.h"
#include "gpu_worker/ddp/store/file_store.h"

namespace {

using gradhub::ddp::DistributedDataParallel;
using gradhub::ddp::ProcessGroup;
using gradhub::ddp::pipeline::PipelineLayout;
using gradhub::ddp::pipeline::PipelineSchedule;
using Clock = std::chrono::steady_clock;

struct BenchShape {
  PipelineSchedule schedule = PipelineSchedule::kOneFOneB;
  int stages = 1;
  int replicas = 1;
  int micro_batches = 1;
  int layers = 1;
  int64_t batch = 1;
  int steps = 1;
  int64_t width = 1024;
  double sleep_ms = 0;  // per layer's forward; twice that in its backward
  bool pingpong = false;

  int world() const { return stages * replicas; }
  int chunks() const { return schedule == PipelineSchedule::kInterleavedOneFOneB ? 2 : 1; }
  int64_t batch_per_replica() const { return batch / replicas; }
};

// What one rank measured over the timed steps.
struct RankResult {
  double median_step_seconds = 0;
  double mean_bubble = 0;
  int64_t peak_activation_bytes = 0;
};

PipelineSchedule ParseSchedule(const std::string& name) {
  if (name == "gpipe") return PipelineSchedule::kGPipe;
  if (name == "1f1b") return PipelineSchedule::kOneFOneB;
  if (name == "1f1b-deep") return PipelineSchedule::kOneFOneBDeepWarmup;
  if (name == "interleaved") return PipelineSchedule::kInterleavedOneFOneB;
  throw std::invalid_argument("SCHEDULE: '" + name +
                              "' is not gpipe, 1f1b, 1f1b-deep or interleaved");
}

BenchShape ParseShape(char** argv) {
  BenchShape shape;
  shape.schedule = ParseSchedule(argv[1]);
  shape.stages = std::stoi(argv[2]);
  shape.replicas = std::stoi(argv[3]);
  shape.micro_batches = std::stoi(argv[4]);
  shape.layers = std::stoi(argv[5]);
  shape.batch = std::stoll(argv[6]);
  shape.steps = std::stoi(argv[7]);
  if (const char* width = std::getenv("GRADHUB_BENCH_WIDTH")) shape.width = std::stoll(width);
  if (const char* sleep = std::getenv("GRADHUB_BENCH_SLEEP_MS")) shape.sleep_ms = std::stod(sleep);
  if (shape.layers % (shape.stages * shape.chunks()) != 0) {
    throw std::invalid_argument("LAYERS: must be a multiple of STAGES (x 2 when interleaved)");
  }
  if (shape.batch % (shape.replicas * shape.micro_batches) != 0) {
    throw std::invalid_argument("BATCH: must be a multiple of REPLICAS x MICRO_BATCHES");
  }
  if (shape.steps < 5) throw std::invalid_argument("STEPS: at least 5 (a fifth is warm-up)");
  return shape;
}

// Compute that takes a set time and no core: sleeps `ms` in forward and twice that in backward
// (a backward costs about two forwards).
struct SleepFunction : torch::autograd::Function<SleepFunction> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               double ms) {
    ctx->saved_data["ms"] = ms;
    std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(ms));
    return x.clone();
  }
  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    const double ms = ctx->saved_data["ms"].toDouble();
    std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(2 * ms));
    return {grads[0], torch::Tensor()};
  }
};

struct SleepImpl : torch::nn::Module {
  explicit SleepImpl(double ms) : ms(ms) {}
  torch::Tensor forward(const torch::Tensor& x) { return SleepFunction::apply(x, ms); }
  double ms;
};
TORCH_MODULE(Sleep);

// Two ranks (pingpong mode), `rounds` timed, messages of `numel` floats.
BenchShape PingPongShape(int rounds, int64_t numel) {
  BenchShape shape;
  shape.pingpong = true;
  shape.width = numel;
  shape.replicas = 2;
  shape.steps = rounds;
  return shape;
}

torch::nn::Sequential MakeLayers(int count, const BenchShape& shape) {
  torch::nn::Sequential layers;
  for (int i = 0; i < count; ++i) {
    layers->push_back(torch::nn::Linear(shape.width, shape.width));
    layers->push_back(torch::nn::ReLU());
    if (shape.sleep_ms > 0) layers->push_back(Sleep(shape.sleep_ms));
  }
  return layers;
}

gradhub::ddp::ProcessGroupOptions GroupOptions(int rank, int size, const std::string& store_dir) {
  gradhub::ddp::ProcessGroupOptions options;
  options.rank = rank;
  options.size = size;
  options.store = std::make_shared<gradhub::ddp::FileStore>(store_dir);
  return options;
}

// Per step of one rank: its time, and the pipeline's report when there is one.
class StepSamples {
 public:
  void Add(double seconds, double bubble, int64_t peak_bytes) {
    seconds_.push_back(seconds);
    bubbles_.push_back(bubble);
    peaks_.push_back(peak_bytes);
  }
  // Over the steps after the first fifth (warm-up: allocations, the first rendezvous).
  RankResult Timed() const {
    const size_t skip = seconds_.size() / 5;
    std::vector<double> times(seconds_.begin() + skip, seconds_.end());
    RankResult result;
    std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
    result.median_step_seconds = times[times.size() / 2];
    for (size_t i = skip; i < bubbles_.size(); ++i) {
      result.mean_bubble += bubbles_[i] / static_cast<double>(bubbles_.size() - skip);
      result.peak_activation_bytes = std::max(result.peak_activation_bytes, peaks_[i]);
    }
    return result;
  }

 private:
  std::vector<double> seconds_, bubbles_;
  std::vector<int64_t> peaks_;
};

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

torch::Tensor CrossEntropy(const torch::Tensor& output, const torch::Tensor& target) {
  return torch::cross_entropy_loss(output, target);
}

// The data-parallel reference (S = 1): DistributedDataParallel over every rank.
RankResult RunDataParallelRank(const BenchShape& shape, int rank, const std::string& store_dir) {
  auto group = gradhub::ddp::CreateProcessGroup(GroupOptions(rank, shape.world(), store_dir));
  torch::manual_seed(0);
  torch::nn::Sequential model = MakeLayers(shape.layers, shape);
  DistributedDataParallel ddp(model.ptr(), group);
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.01));
  const torch::Tensor x = torch::randn({shape.batch_per_replica(), shape.width});
  const torch::Tensor y = torch::randint(shape.width, {shape.batch_per_replica()});
  StepSamples samples;
  for (int step = 0; step < shape.steps; ++step) {
    const Clock::time_point start = Clock::now();
    ddp.ZeroGrad();
    ddp.Backward(ddp.Forward([&] { return CrossEntropy(model->forward(x), y); }));
    sgd.step();
    samples.Add(SecondsSince(start), 0, 0);
  }
  return samples.Timed();
}

// One stage's pieces of the model (one per chunk) and their data parallelism.
struct StageModel {
  std::vector<torch::nn::Sequential> chunks;
  std::vector<std::unique_ptr<DistributedDataParallel>> ddps;  // by chunk, when D > 1

  std::vector<gradhub::ddp::pipeline::StageChunk> Chunks() const {
    std::vector<gradhub::ddp::pipeline::StageChunk> result;
    for (size_t c = 0; c < chunks.size(); ++c) {
      torch::nn::Sequential chunk = chunks[c];
      result.push_back({[chunk](const at::Tensor& x) mutable { return chunk->forward(x); },
                        ddps.empty() ? nullptr : ddps[c].get()});
    }
    return result;
  }
  std::vector<torch::Tensor> Parameters() const {
    std::vector<torch::Tensor> parameters;
    for (const auto& chunk : chunks) {
      for (const auto& p : chunk->parameters()) parameters.push_back(p);
    }
    return parameters;
  }
  // DDP's gradients are views into its buckets: its ZeroGrad zeroes them in place.
  void ZeroGrad(torch::optim::Optimizer& optimizer) {
    if (ddps.empty()) optimizer.zero_grad();
    for (auto& ddp : ddps) ddp->ZeroGrad();
  }
};

StageModel MakeStageModel(const BenchShape& shape, const gradhub::ddp::ProcessGroupOptions& options,
                          const PipelineLayout& layout) {
  std::shared_ptr<ProcessGroup> replicas;
  for (int s = 0; s < shape.stages && shape.replicas > 1; ++s) {
    if (auto group = gradhub::ddp::CreateSubgroup(options, layout.DataParallelRanks(s))) {
      replicas = group;
    }
  }
  torch::manual_seed(layout.StageOf(options.rank));
  StageModel model;
  for (int c = 0; c < shape.chunks(); ++c) {
    model.chunks.push_back(MakeLayers(shape.layers / shape.stages / shape.chunks(), shape));
    if (replicas) {
      model.ddps.push_back(
          std::make_unique<DistributedDataParallel>(model.chunks.back().ptr(), replicas));
    }
  }
  return model;
}

// GRADHUB_BENCH_VERBOSE: every step's report of every rank, on stderr (where the time goes).
void PrintReport(int rank, int step, const gradhub::ddp::pipeline::StageStepReport& report) {
  std::fprintf(stderr,
               "rank %d step %d: step %.2f ms, forward %.2f, backward %.2f, receive wait %.2f, "
               "send %.2f, allreduce wait %.2f, bubble %.3f\n",
               rank, step, report.step_seconds * 1e3, report.forward_seconds * 1e3,
               report.backward_seconds * 1e3, report.receive_wait_seconds * 1e3,
               report.send_seconds * 1e3, report.allreduce_wait_seconds * 1e3,
               report.bubble_fraction);
}

RankResult RunPipelineRank(const BenchShape& shape, int rank, const std::string& store_dir) {
  const gradhub::ddp::ProcessGroupOptions options = GroupOptions(rank, shape.world(), store_dir);
  auto world = gradhub::ddp::CreateProcessGroup(options);
  const PipelineLayout layout(shape.world(), shape.stages);
  StageModel model = MakeStageModel(shape, options, layout);
  gradhub::ddp::pipeline::PipelineStageOptions stage_options;
  stage_options.schedule = shape.schedule;
  stage_options.micro_batches = shape.micro_batches;
  stage_options.chunks_per_stage = shape.chunks();
  gradhub::ddp::pipeline::PipelineStage stage(world, layout, stage_options, model.Chunks(),
                                              CrossEntropy);
  torch::optim::SGD sgd(model.Parameters(), torch::optim::SGDOptions(0.01));
  const torch::Tensor x = torch::randn({shape.batch_per_replica(), shape.width});
  const torch::Tensor y = torch::randint(shape.width, {shape.batch_per_replica()});
  StepSamples samples;
  for (int step = 0; step < shape.steps; ++step) {
    const Clock::time_point start = Clock::now();
    model.ZeroGrad(sgd);
    const gradhub::ddp::pipeline::StageStepReport report = stage.Step({x, y});
    sgd.step();
    samples.Add(SecondsSince(start), report.bubble_fraction, report.peak_activation_bytes);
    if (std::getenv("GRADHUB_BENCH_VERBOSE") != nullptr) PrintReport(rank, step, report);
  }
  return samples.Timed();
}

// Rank 0 sends, rank 1 answers; rank 0's round trips as a result (median; mean as "bubble").
RankResult RunPingPongRank(int rank, const BenchShape& shape, const std::string& store_dir) {
  const int rounds = shape.steps;
  auto group = gradhub::ddp::CreateProcessGroup(GroupOptions(rank, 2, store_dir));
  at::Tensor message = at::zeros({shape.width});
  std::vector<double> times;
  for (int round = 0; round < 2 * rounds; ++round) {
    const Clock::time_point start = Clock::now();
    if (rank == 0) {
      group->Send(message, 1, 0)->Wait();
      group->Recv(message, 1, 1)->Wait();
    } else {
      group->Recv(message, 0, 0)->Wait();
      group->Send(message, 0, 1)->Wait();
    }
    if (round >= rounds) times.push_back(SecondsSince(start));
  }
  RankResult result;
  for (double t : times) result.mean_bubble += t / static_cast<double>(times.size());
  std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
  result.median_step_seconds = times[times.size() / 2];
  return result;
}

void WriteResult(const std::string& path, const RankResult& result) {
  std::ofstream(path) << result.median_step_seconds << " " << result.mean_bubble << " "
                      << result.peak_activation_bytes << "\n";
}

RankResult ReadResult(const std::string& path) {
  RankResult result;
  std::ifstream in(path);
  if (!(in >> result.median_step_seconds >> result.mean_bubble >> result.peak_activation_bytes)) {
    throw std::runtime_error("no result in " + path + " (its rank failed)");
  }
  return result;
}

// Runs every rank as a process; each writes its result under `dir`. True when all succeeded.
bool RunRanks(const BenchShape& shape, const std::string& dir) {
  std::vector<pid_t> children;
  for (int rank = 0; rank < shape.world(); ++rank) {
    const pid_t pid = fork();
    if (pid == 0) {
      at::set_num_threads(1);
      const std::string store = dir + "/store";
      const RankResult result = shape.pingpong      ? RunPingPongRank(rank, shape, store)
                                : shape.stages == 1 ? RunDataParallelRank(shape, rank, store)
                                                    : RunPipelineRank(shape, rank, store);
      WriteResult(dir + "/result-" + std::to_string(rank), result);
      _exit(0);
    }
    children.push_back(pid);
  }
  int failures = 0;
  for (pid_t child : children) {
    int status = 0;
    waitpid(child, &status, 0);
    failures += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  return failures == 0;
}

// "a,b,c": each stage's value, `of` the results of the stage's ranks.
template <typename Value, typename Combine>
std::string PerStage(const BenchShape& shape, const PipelineLayout& layout,
                     const std::vector<RankResult>& results, Combine of) {
  std::string text;
  for (int s = 0; s < shape.stages; ++s) {
    std::vector<RankResult> stage;
    for (int rank : layout.DataParallelRanks(s)) stage.push_back(results[rank]);
    text += (s ? "," : "") + std::to_string(static_cast<Value>(of(stage)));
  }
  return text;
}

void PrintSummary(const BenchShape& shape, const std::vector<RankResult>& results) {
  if (shape.pingpong) {
    std::printf("%.6f %.6f\n", results[0].median_step_seconds, results[0].mean_bubble);
    return;
  }
  if (shape.stages == 1) {
    std::printf("%.6f - - -\n", results[0].median_step_seconds);
    return;
  }
  const PipelineLayout layout(shape.world(), shape.stages);
  const std::string bubbles =
      PerStage<double>(shape, layout, results, [](const std::vector<RankResult>& ranks) {
        double sum = 0;
        for (const RankResult& r : ranks) sum += r.mean_bubble;
        return sum / static_cast<double>(ranks.size());
      });
  const std::string peaks =
      PerStage<int64_t>(shape, layout, results, [](const std::vector<RankResult>& ranks) {
        int64_t peak = 0;
        for (const RankResult& r : ranks) peak = std::max(peak, r.peak_activation_bytes);
        return peak;
      });
  const double ideal = gradhub::ddp::pipeline::IdealBubbleFraction(
      shape.schedule, shape.stages, shape.micro_batches, shape.chunks());
  std::printf("%.6f %.6f %s %s\n", results[0].median_step_seconds, ideal, bubbles.c_str(),
              peaks.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  const bool pingpong = (argc == 3 || argc == 4) && std::string(argv[1]) == "pingpong";
  if (argc != 8 && !pingpong) {
    std::fprintf(
        stderr,
        "usage: bench_pipeline gpipe|1f1b|1f1b-deep|interleaved STAGES REPLICAS MICRO_BATCHES "
        "LAYERS BATCH STEPS\n       bench_pipeline pingpong ROUNDS [NUMEL]\n");
    return 2;
  }
  BenchShape shape;
  try {
    shape = pingpong ? PingPongShape(std::stoi(argv[2]), argc == 4 ? std::stoll(argv[3]) : 8)
                     : ParseShape(argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_pipeline: %s\n", e.what());
    return 2;
  }
  char pattern[] = "/tmp/gradhub-bench-pipeline-XXXXXX";
  const std::string dir = mkdtemp(pattern);
  std::filesystem::create_directory(dir + "/store");
  const bool ok = RunRanks(shape, dir);
  std::vector<RankResult> results;
  for (int rank = 0; ok && rank < shape.world(); ++rank) {
    results.push_back(ReadResult(dir + "/result-" + std::to_string(rank)));
  }
  std::filesystem::remove_all(dir);
  if (!ok) {
    std::fprintf(stderr, "bench_pipeline: a rank failed\n");
    return 1;
  }
  PrintSummary(shape, results);
  return 0;
}
