// Step time of gradhub's DDP on MLPs at world size 1 and 2, ranks as processes on one host,
// one thread each; allreduces through shared memory (the default on one host), or over
// loopback TCP with GRADHUB_BENCH_SHARED_MEMORY=0.
// Prints one line per run: <model> <world_size> <median step seconds>.
// Usage: bench_ddp MODEL BATCH WORLD STEPS   (MODEL like 784-1024-1024-10)
#include <sys/wait.h>
#include <unistd.h>

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "gpu_worker/ddp/distributed_data_parallel.h"
#include "gpu_worker/ddp/store/file_store.h"

namespace {

using gradhub::ddp::DistributedDataParallel;

struct Mlp : torch::nn::Module {
  explicit Mlp(const std::vector<int64_t>& widths) {
    for (size_t i = 0; i + 1 < widths.size(); ++i) {
      layers.push_back(register_module("fc" + std::to_string(i),
                                       torch::nn::Linear(widths[i], widths[i + 1])));
    }
  }
  torch::Tensor forward(torch::Tensor x) {
    for (size_t i = 0; i < layers.size(); ++i) {
      x = layers[i]->forward(x);
      if (i + 1 < layers.size()) x = torch::relu(x);
    }
    return x;
  }
  std::vector<torch::nn::Linear> layers;
};

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

double RunRank(int rank, int world, const std::vector<int64_t>& widths, int64_t batch, int steps,
               const std::string& store_dir) {
  at::set_num_threads(1);
  gradhub::ddp::ProcessGroupOptions options;
  options.rank = rank;
  options.size = world;
  options.store = std::make_shared<gradhub::ddp::FileStore>(store_dir);
  if (const char* channels = std::getenv("GRADHUB_BENCH_CHANNELS")) options.channels = std::atoi(channels);
  if (const char* shm = std::getenv("GRADHUB_BENCH_SHARED_MEMORY")) {
    options.shared_memory = std::string(shm) != "0";
  }
  torch::manual_seed(0);
  auto model = std::make_shared<Mlp>(widths);
  DistributedDataParallel ddp(model, gradhub::ddp::CreateProcessGroup(options));
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  torch::Tensor x = torch::randn({batch, widths.front()});
  torch::Tensor y = torch::randint(widths.back(), {batch});
  std::vector<double> times;
  for (int step = 0; step < steps; ++step) {
    auto start = std::chrono::steady_clock::now();
    ddp.ZeroGrad();
    torch::Tensor loss =
        ddp.Forward([&] { return torch::cross_entropy_loss(model->forward(x), y); });
    ddp.Backward(loss);
    optimizer.step();
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  times.erase(times.begin(), times.begin() + steps / 5);  // warm-up
  std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
  return times[times.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: bench_ddp MODEL BATCH WORLD STEPS\n");
    return 2;
  }
  const std::vector<int64_t> widths = ParseWidths(argv[1]);
  const int64_t batch = std::stoll(argv[2]);
  const int world = std::stoi(argv[3]);
  const int steps = std::stoi(argv[4]);
  char pattern[] = "/tmp/gradhub-bench-ddp-XXXXXX";
  const std::string store_dir = mkdtemp(pattern);

  std::vector<pid_t> children;
  for (int rank = 1; rank < world; ++rank) {
    pid_t pid = fork();
    if (pid == 0) {
      RunRank(rank, world, widths, batch, steps, store_dir);
      _exit(0);
    }
    children.push_back(pid);
  }
  const double median = RunRank(0, world, widths, batch, steps, store_dir);
  int failures = 0;
  for (pid_t child : children) {
    int status = 0;
    waitpid(child, &status, 0);
    failures += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  std::filesystem::remove_all(store_dir);
  std::printf("%s %d %.6f\n", argv[1], world, median);
  return failures == 0 ? 0 : 1;
}
