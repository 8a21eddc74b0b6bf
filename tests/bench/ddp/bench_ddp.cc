// Step time of gradhub's DDP on MLPs at world size 1 and 2, ranks as processes on one host,
// one thread each; allreduces through shared memory (the default on one host), or over
// loopback TCP with GRADHUB_BENCH_SHARED_MEMORY=0. With GRADHUB_BENCH_NETNS and
// GRADHUB_BENCH_ADDRESSES (tests/bench/bench_hosts.h) each rank runs in a network namespace of
// its own "host" and talks TCP over its address, shared memory off (tests/bench/network).
// GRADHUB_BENCH_BUCKET_MIB and GRADHUB_BENCH_FIRST_BUCKET_MIB set the Reducer's bucket caps
// (defaults 25 and 1, as PyTorch's), for choosing them from measurements.
// GRADHUB_BENCH_PHASES=1 also prints each rank's median phase times to stderr (StepPhases).
// Prints one line per run: <model> <world_size> <median step seconds> <bytes per step>
// <mean step seconds>, the bytes being what rank 0 handed to collectives per step (gradient
// allreduces, ZeRO's parameter broadcasts, local SGD's parameter averages), averaged over the
// timed steps; the mean counts local SGD's averaging steps, which the median leaves out.
// Usage: bench_ddp MODEL BATCH WORLD STEPS [MODE]   (MODEL like 784-1024-1024-10)
// MODE: plain (default), bf16 (forward and loss under CPU autocast), bf16comm (the BF16 comm
// hook: gradients averaged in bfloat16, half the bytes), zero (ZeRO-1, SGD momentum sharded),
// localsgd8 (local steps, parameters averaged every 8), powersgd4 (PowerSGD rank 4,
// compressing from step 2 so the timed steps are compressed).
#include <sys/wait.h>
#include <unistd.h>

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "gpu_worker/ddp/comm_hook.h"
#include "gpu_worker/ddp/distributed_data_parallel.h"
#include "gpu_worker/ddp/mixed_precision.h"
#include "gpu_worker/ddp/model_averager.h"
#include "gpu_worker/ddp/powersgd.h"
#include "gpu_worker/ddp/store/file_store.h"
#include "gpu_worker/ddp/zero_redundancy_optimizer.h"
#include "tests/bench/bench_hosts.h"
#include "tests/unit/ddp/test_mlp.h"

namespace {

using gradhub::ddp::DistributedDataParallel;

using gradhub::testing::Mlp;

std::vector<int64_t> ParseWidths(const std::string& text) {
  std::vector<int64_t> widths;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find('-', start);
    if (end == std::string::npos) end = text.size();
    widths.push_back(std::stoll(text.substr(start, end - start)));
    start = end + 1;
  }
  return widths;
}

struct RankResult {
  double median_seconds = 0;
  double mean_seconds = 0;
  double bytes_per_step = 0;
};

// GRADHUB_BENCH_PHASES=1: where a step's time goes, per rank, as medians over the timed steps
// (milliseconds, to stderr): zero_grad, forward, backward (autograd, the buckets' allreduces
// that overlap it, and Finalize), of that the wait in Finalize for allreduces still running,
// the allreduces' own run time summed over buckets, the optimizer step. For comparing a
// world-2 step with a world-1 one phase by phase.
struct StepPhases {
  std::vector<double> zero_grad, forward, backward, finalize_wait, allreduce, optimizer;

  static double Median(std::vector<double> values) {
    if (values.empty()) return 0;
    std::nth_element(values.begin(), values.begin() + values.size() / 2, values.end());
    return values[values.size() / 2];
  }
  void Print(int rank, int world) const {
    std::fprintf(stderr,
                 "phases world %d rank %d ms: zero_grad %.3f forward %.3f backward %.3f "
                 "(finalize_wait %.3f allreduce %.3f) optimizer %.3f\n",
                 world, rank, Median(zero_grad), Median(forward), Median(backward),
                 Median(finalize_wait), Median(allreduce), Median(optimizer));
  }
};

RankResult RunRank(int rank, int world, const std::vector<int64_t>& widths, int64_t batch,
                   int steps, const std::string& store_dir, const std::string& mode,
                   const std::optional<gradhub::bench::BenchHosts>& hosts) {
  // Before anything starts a thread: the rank's threads and sockets must all be on its host.
  const std::string address = hosts ? gradhub::bench::JoinBenchHost(*hosts, rank) : "";
  at::set_num_threads(1);
  gradhub::ddp::ProcessGroupOptions options;
  options.rank = rank;
  options.size = world;
  options.store = std::make_shared<gradhub::ddp::FileStore>(store_dir);
  gradhub::ddp::GlooOptions& gloo = options.gloo.emplace();
  if (const char* channels = std::getenv("GRADHUB_BENCH_CHANNELS"))
    gloo.channels = std::atoi(channels);
  if (const char* shm = std::getenv("GRADHUB_BENCH_SHARED_MEMORY")) {
    gloo.shared_memory = std::string(shm) != "0";
  }
  if (hosts) {
    gloo.hostname = address;
    // Ranks on different hosts cannot share a segment; off even for the ranks that share a
    // namespace, so every rank takes the same path whatever the engine decides about hosts.
    gloo.shared_memory = false;
  }
  torch::manual_seed(0);
  auto model = std::make_shared<Mlp>(widths);
  auto group = gradhub::ddp::CreateProcessGroup(options);
  gradhub::ddp::DdpOptions ddp_options;
  // For choosing the Reducer's defaults from measurements: bucket caps in MiB.
  if (const char* mib = std::getenv("GRADHUB_BENCH_BUCKET_MIB")) {
    ddp_options.reducer.bucket_cap_bytes = static_cast<int64_t>(std::atof(mib) * (1 << 20));
  }
  if (const char* mib = std::getenv("GRADHUB_BENCH_FIRST_BUCKET_MIB")) {
    ddp_options.reducer.first_bucket_bytes = static_cast<int64_t>(std::atof(mib) * (1 << 20));
  }
  if (mode == "powersgd4") {
    gradhub::ddp::PowerSgdOptions powersgd;
    powersgd.matrix_approximation_rank = 4;
    powersgd.start_iter = 2;
    ddp_options.reducer.comm_hook = std::make_shared<gradhub::ddp::PowerSgdHook>(powersgd);
  } else if (mode == "bf16comm") {
    ddp_options.reducer.comm_hook = std::make_shared<gradhub::ddp::CastCompressHook>(at::kBFloat16);
  }
  DistributedDataParallel ddp(model, group, ddp_options);
  auto sgd = [](std::vector<at::Tensor> parameters) -> std::unique_ptr<torch::optim::Optimizer> {
    return std::make_unique<torch::optim::SGD>(parameters,
                                               torch::optim::SGDOptions(0.01).momentum(0.9));
  };
  std::unique_ptr<torch::optim::Optimizer> plain;
  std::unique_ptr<gradhub::ddp::ZeroRedundancyOptimizer> zero;
  int64_t parameter_bytes = 0;
  for (const auto& p : model->parameters()) parameter_bytes += p.nbytes();
  if (mode == "zero") {
    zero = std::make_unique<gradhub::ddp::ZeroRedundancyOptimizer>(model->parameters(), group, sgd);
  } else {
    plain = sgd(model->parameters());
  }
  std::unique_ptr<gradhub::ddp::PeriodicModelAverager> averager;
  if (mode == "localsgd8") {
    averager = std::make_unique<gradhub::ddp::PeriodicModelAverager>(
        model->parameters(), group,
        gradhub::ddp::LocalSgdOptions{/*warmup_steps=*/2, /*period=*/8});
  }
  if (mode != "plain" && mode != "bf16" && !zero && !averager &&
      ddp_options.reducer.comm_hook == nullptr) {
    throw std::invalid_argument("unknown mode " + mode);
  }
  torch::Tensor x = torch::randn({batch, widths.front()});
  torch::Tensor y = torch::randint(widths.back(), {batch});
  std::vector<double> times;
  int64_t timed_bytes = 0;
  const bool phases_wanted = std::getenv("GRADHUB_BENCH_PHASES") != nullptr;
  StepPhases phases;
  using Clock = std::chrono::steady_clock;
  const auto ms_since = [](Clock::time_point since) {
    return std::chrono::duration<double, std::milli>(Clock::now() - since).count();
  };
  for (int step = 0; step < steps; ++step) {
    const bool timed = step >= steps / 5;
    auto start = Clock::now();
    ddp.ZeroGrad();
    if (timed) phases.zero_grad.push_back(ms_since(start));
    auto phase_start = Clock::now();
    std::optional<DistributedDataParallel::NoSyncGuard> local;
    if (averager && !averager->Synchronous(step)) local.emplace(&ddp);
    torch::Tensor loss = ddp.Forward([&] {
      std::optional<gradhub::ddp::AutocastGuard> bf16;
      if (mode == "bf16") bf16.emplace(c10::DeviceType::CPU, at::kBFloat16);
      return torch::cross_entropy_loss(model->forward(x), y);
    });
    if (timed) phases.forward.push_back(ms_since(phase_start));
    phase_start = Clock::now();
    ddp.Backward(loss);
    if (timed) {
      phases.backward.push_back(ms_since(phase_start));
      const gradhub::ddp::ReductionStats& reduction = ddp.last_reduction();
      phases.finalize_wait.push_back(
          std::chrono::duration<double, std::milli>(reduction.wait).count());
      phases.allreduce.push_back(
          std::chrono::duration<double, std::milli>(reduction.allreduce).count());
    }
    phase_start = Clock::now();
    int64_t bytes = local ? 0 : ddp.last_reduction().bytes;
    local.reset();
    if (zero) {
      zero->Step();
      bytes += world > 1 ? parameter_bytes : 0;
    } else {
      plain->step();
    }
    if (averager) bytes += averager->AfterStep(step);
    if (timed) phases.optimizer.push_back(ms_since(phase_start));
    times.push_back(std::chrono::duration<double>(Clock::now() - start).count());
    if (timed) timed_bytes += bytes;
  }
  if (phases_wanted) phases.Print(rank, world);
  times.erase(times.begin(), times.begin() + steps / 5);  // warm-up
  RankResult result;
  result.bytes_per_step = static_cast<double>(timed_bytes) / times.size();
  for (double seconds : times) result.mean_seconds += seconds / times.size();
  std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
  result.median_seconds = times[times.size() / 2];
  return result;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5 && argc != 6) {
    std::fprintf(stderr, "usage: bench_ddp MODEL BATCH WORLD STEPS [MODE]\n");
    return 2;
  }
  const std::string mode = argc == 6 ? argv[5] : "plain";
  const std::vector<int64_t> widths = ParseWidths(argv[1]);
  const int64_t batch = std::stoll(argv[2]);
  const int world = std::stoi(argv[3]);
  const int steps = std::stoi(argv[4]);
  const std::optional<gradhub::bench::BenchHosts> hosts =
      gradhub::bench::BenchHostsFromEnvironment(world);
  char pattern[] = "/tmp/gradhub-bench-ddp-XXXXXX";
  const std::string store_dir = mkdtemp(pattern);

  std::vector<pid_t> children;
  for (int rank = 1; rank < world; ++rank) {
    pid_t pid = fork();
    if (pid == 0) {
      RunRank(rank, world, widths, batch, steps, store_dir, mode, hosts);
      _exit(0);
    }
    children.push_back(pid);
  }
  const RankResult result = RunRank(0, world, widths, batch, steps, store_dir, mode, hosts);
  int failures = 0;
  for (pid_t child : children) {
    int status = 0;
    waitpid(child, &status, 0);
    failures += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  std::filesystem::remove_all(store_dir);
  std::printf("%s %d %.6f %.0f %.6f\n", argv[1], world, result.median_seconds,
              result.bytes_per_step, result.mean_seconds);
  return failures == 0 ? 0 : 1;
}
