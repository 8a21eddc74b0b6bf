// The engine's efficiency options against their references: loss scaling and autocast on their
// own, ZeRO-1 and post-local SGD against plain DDP, PowerSGD against uncompressed allreduce.
// Ranks are threads over an InMemoryStore with real Gloo groups, as in ddp_test.cc.
#include <torch/torch.h>

#include <gtest/gtest.h>

#include <limits>
#include <memory>
#include <numeric>

#include "gpu_worker/ddp/distributed_data_parallel.h"
#include "gpu_worker/ddp/mixed_precision.h"
#include "gpu_worker/ddp/model_averager.h"
#include "gpu_worker/ddp/powersgd.h"
#include "gpu_worker/ddp/store/in_memory_store.h"
#include "gpu_worker/ddp/zero_redundancy_optimizer.h"
#include "tests/unit/ddp/test_mlp.h"
#include "tests/unit/ddp/test_ranks.h"

namespace gradhub::ddp {
namespace {

using gradhub::testing::Mlp;

// A learnable task: labels from a fixed random linear teacher; each step a new global batch,
// the same on every rank (each rank takes its slice).
struct Task {
  int64_t features, classes;
  torch::Tensor teacher;
  Task(int64_t features, int64_t classes) : features(features), classes(classes) {
    auto generator = at::detail::createCPUGenerator(99);
    teacher = torch::randn({features, classes}, generator);
  }
  std::pair<torch::Tensor, torch::Tensor> Batch(int step, int64_t size) const {
    auto generator = at::detail::createCPUGenerator(1000 + step);
    torch::Tensor x = torch::randn({size, features}, generator);
    return {x, x.matmul(teacher).argmax(1)};
  }
};

enum class OptimizerKind { kSgdMomentum, kAdam };

// lr 0: 1e-3 for Adam, 0.02 for SGD.
std::unique_ptr<torch::optim::Optimizer> MakeOptimizer(OptimizerKind kind, double lr,
                                                       std::vector<at::Tensor> parameters) {
  if (kind == OptimizerKind::kAdam) {
    return std::make_unique<torch::optim::Adam>(parameters,
                                                torch::optim::AdamOptions(lr > 0 ? lr : 1e-3));
  }
  return std::make_unique<torch::optim::SGD>(
      parameters, torch::optim::SGDOptions(lr > 0 ? lr : 0.02).momentum(0.9));
}

struct RunSpec {
  int world_size = 2;
  int steps = 20;
  int64_t batch_per_rank = 8;
  std::vector<int64_t> widths = {16, 32, 32, 4};
  OptimizerKind optimizer = OptimizerKind::kAdam;
  double lr = 0;
  DdpOptions ddp;
  // Each rank gets its own PowerSgdHook with these options (its state is per rank).
  std::optional<PowerSgdOptions> powersgd;
  bool zero = false;
  std::optional<LocalSgdOptions> local_sgd;
};

struct Outcome {
  std::vector<std::vector<torch::Tensor>> parameters;  // by rank
  std::vector<double> losses;                          // rank 0's, per step
  std::vector<int64_t> bytes;                          // rank 0's bytes reduced, per step
  std::vector<int64_t> state_bytes;                    // optimizer state, by rank
  double held_out_loss = 0;                            // rank 0's model, after the last step
};

// Trains one MLP per rank (all from seed 7) on the task and returns the end state.
Outcome Train(const RunSpec& run) {
  const int n = run.world_size;
  const Task task(run.widths.front(), run.widths.back());
  auto store = std::make_shared<InMemoryStore>();
  Outcome outcome;
  outcome.parameters.resize(n);
  outcome.state_bytes.resize(n);
  // Built here, not in the rank threads: they would race on the global generator.
  std::vector<std::shared_ptr<Mlp>> models;
  for (int r = 0; r < n; ++r) {
    torch::manual_seed(7);
    models.push_back(std::make_shared<Mlp>(run.widths));
  }
  testing::spawnThreads(n, [&](int rank) {
    ProcessGroupOptions options;
    options.rank = rank;
    options.size = n;
    options.store = store;
    auto group = CreateProcessGroup(options);
    auto model = models[rank];
    DdpOptions ddp_options = run.ddp;
    if (run.powersgd) ddp_options.reducer.comm_hook = std::make_shared<PowerSgdHook>(*run.powersgd);
    DistributedDataParallel ddp(model, group, ddp_options);
    std::unique_ptr<torch::optim::Optimizer> plain;
    std::unique_ptr<ZeroRedundancyOptimizer> zero;
    if (run.zero) {
      zero = std::make_unique<ZeroRedundancyOptimizer>(
          model->parameters(), group, [&](std::vector<at::Tensor> p) {
            return MakeOptimizer(run.optimizer, run.lr, std::move(p));
          });
    } else {
      plain = MakeOptimizer(run.optimizer, run.lr, model->parameters());
    }
    std::unique_ptr<PeriodicModelAverager> averager;
    if (run.local_sgd) {
      averager =
          std::make_unique<PeriodicModelAverager>(model->parameters(), group, *run.local_sgd);
    }
    for (int step = 0; step < run.steps; ++step) {
      auto [x, y] = task.Batch(step, run.batch_per_rank * n);
      x = x.narrow(0, rank * run.batch_per_rank, run.batch_per_rank);
      y = y.narrow(0, rank * run.batch_per_rank, run.batch_per_rank);
      ddp.ZeroGrad();
      std::optional<DistributedDataParallel::NoSyncGuard> local;
      if (averager && !averager->Synchronous(step)) local.emplace(&ddp);
      torch::Tensor loss =
          ddp.Forward([&] { return torch::cross_entropy_loss(model->forward(x), y); });
      ddp.Backward(loss);
      int64_t bytes = local ? 0 : ddp.last_reduction().bytes;
      local.reset();
      if (zero) {
        zero->Step();
      } else {
        plain->step();
      }
      if (averager) bytes += averager->AfterStep(step);
      if (rank == 0) {
        outcome.losses.push_back(loss.item<double>());
        outcome.bytes.push_back(bytes);
      }
    }
    for (const auto& p : model->parameters())
      outcome.parameters[rank].push_back(p.detach().clone());
    if (rank == 0) {
      torch::NoGradGuard no_grad;
      auto [x, y] = task.Batch(-1, 4096);  // a batch no step trained on
      outcome.held_out_loss = torch::cross_entropy_loss(model->forward(x), y).item<double>();
    }
    outcome.state_bytes[rank] = zero ? zero->local_state_bytes() : OptimizerStateBytes(*plain);
  });
  return outcome;
}

double MaxDifference(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, (a[i] - b[i]).abs().max().item<double>());
  return worst;
}

bool BitEqual(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  for (size_t i = 0; i < a.size(); ++i) {
    if (!torch::equal(a[i], b[i])) return false;
  }
  return true;
}

double MeanOfLast(const std::vector<double>& values, size_t count) {
  double sum = 0;
  for (size_t i = values.size() - count; i < values.size(); ++i) sum += values[i];
  return sum / count;
}

class EfficiencyTest : public ::testing::Test {
 protected:
  void SetUp() override { at::set_num_threads(1); }
};

// --- mixed precision ---

std::vector<at::Tensor> ParametersWithGrads(std::vector<float> grads) {
  std::vector<at::Tensor> parameters;
  for (float g : grads) {
    at::Tensor p = torch::zeros({3}, torch::requires_grad());
    p.mutable_grad() = torch::full({3}, g);
    parameters.push_back(p);
  }
  return parameters;
}

TEST_F(EfficiencyTest, LossScalerUnscalesSkipsBacksOffAndGrows) {
  LossScalerOptions options;
  options.init_scale = 1024;
  options.growth_interval = 3;
  LossScaler scaler(options);
  EXPECT_EQ(scaler.Scale(torch::tensor(2.0f)).item<float>(), 2048.0f);

  auto clean = ParametersWithGrads({1024.0f, -512.0f});
  EXPECT_FALSE(scaler.Unscale(clean));
  EXPECT_TRUE(torch::equal(clean[0].grad(), torch::full({3}, 1.0f)));
  EXPECT_TRUE(torch::equal(clean[1].grad(), torch::full({3}, -0.5f)));
  scaler.Update(false);

  const float inf = std::numeric_limits<float>::infinity();
  for (float bad : {inf, -inf, std::numeric_limits<float>::quiet_NaN()}) {
    auto poisoned = ParametersWithGrads({1.0f, bad});
    EXPECT_TRUE(scaler.Unscale(poisoned)) << bad;
    scaler.Update(true);
  }
  EXPECT_EQ(scaler.scale(), 1024.0 / 8);  // backed off three times
  EXPECT_EQ(scaler.skipped_steps(), 3);
  EXPECT_EQ(scaler.state().growth_tracker, 0) << "a skipped step restarts the clean count";

  for (int i = 0; i < 2; ++i) scaler.Update(false);
  EXPECT_EQ(scaler.scale(), 128.0) << "grows only after growth_interval clean steps";
  scaler.Update(false);
  EXPECT_EQ(scaler.scale(), 256.0);
  EXPECT_EQ(scaler.state().growth_tracker, 0);
}

TEST_F(EfficiencyTest, AutocastGuardRunsMatmulsInBfloat16AndRestores) {
  torch::Tensor a = torch::randn({4, 8}), b = torch::randn({8, 3});
  {
    AutocastGuard bf16(c10::DeviceType::CPU, at::kBFloat16);
    EXPECT_EQ(torch::matmul(a, b).scalar_type(), at::kBFloat16);
    {
      AutocastGuard nested(c10::DeviceType::CPU, at::kBFloat16);
      EXPECT_EQ(torch::mm(a, b).scalar_type(), at::kBFloat16);
    }
    EXPECT_EQ(torch::mm(a, b).scalar_type(), at::kBFloat16) << "the outer scope is still on";
  }
  EXPECT_EQ(torch::matmul(a, b).scalar_type(), at::kFloat);
  EXPECT_THROW(AutocastGuard(c10::DeviceType::CPU, at::kHalf), std::invalid_argument);
}

// --- ZeRO-1 ---

TEST_F(EfficiencyTest, PartitionIsGreedyBySizeLargestFirst) {
  std::vector<at::Tensor> parameters = {torch::zeros({10}), torch::zeros({100}), torch::zeros({60}),
                                        torch::zeros({50}), torch::zeros({5})};
  // 100 -> 0, 60 -> 1, 50 -> 1 (60 < 100), 10 -> 0 (100 < 110), 5 -> 0 (110 = 110: lowest).
  EXPECT_EQ(PartitionParameters(parameters, 2), (std::vector<int>{0, 0, 1, 1, 0}));
  EXPECT_EQ(PartitionParameters(parameters, 1), (std::vector<int>(5, 0)));
}

TEST_F(EfficiencyTest, ZeroWithAdamEqualsPlainDdpAtWorldSize2And3) {
  for (int world : {2, 3}) {
    RunSpec run;
    run.world_size = world;
    run.steps = 20;
    run.widths = {16, 64, 48, 32, 4};
    const Outcome plain = Train(run);
    run.zero = true;
    const Outcome sharded = Train(run);
    int64_t total_state = 0;
    for (int r = 0; r < world; ++r) {
      EXPECT_LE(MaxDifference(sharded.parameters[r], plain.parameters[0]), 1e-6)
          << "world " << world << " rank " << r;
      total_state += sharded.state_bytes[r];
      // About 1/world of the state each (the greedy split is exact only up to a parameter).
      EXPECT_LT(sharded.state_bytes[r], plain.state_bytes[0] / world + plain.state_bytes[0] / 4)
          << "world " << world << " rank " << r;
    }
    EXPECT_EQ(total_state, plain.state_bytes[0]) << "every state tensor is on exactly one rank";
    RunSpec untouched = run;
    untouched.steps = 0;
    EXPECT_GT(MaxDifference(plain.parameters[0], Train(untouched).parameters[0]), 1e-3)
        << "the run moved the weights";
  }
}

// --- post-local SGD ---

LocalSgdOptions LocalSgd(int64_t warmup_steps, int64_t period) {
  LocalSgdOptions options;
  options.warmup_steps = warmup_steps;
  options.period = period;
  return options;
}

TEST_F(EfficiencyTest, LocalSgdPeriod1IsPlainDdpBitForBit) {
  RunSpec run;
  run.optimizer = OptimizerKind::kSgdMomentum;
  const Outcome plain = Train(run);
  run.local_sgd = LocalSgd(/*warmup_steps=*/0, /*period=*/1);
  const Outcome local = Train(run);
  for (int r = 0; r < run.world_size; ++r) {
    EXPECT_TRUE(BitEqual(plain.parameters[r], plain.parameters[0])) << "plain DDP, rank " << r;
    EXPECT_TRUE(BitEqual(local.parameters[r], plain.parameters[r])) << "rank " << r;
  }
}

TEST_F(EfficiencyTest, LocalSgdPeriod8LossWithin3PercentAndRanksAgreeAfterAverage) {
  RunSpec run;
  run.optimizer = OptimizerKind::kSgdMomentum;
  run.steps = 580;
  run.batch_per_rank = 32;
  const Outcome plain = Train(run);
  run.local_sgd = LocalSgd(/*warmup_steps=*/20, /*period=*/8);
  const Outcome local = Train(run);
  // The loss of the model each run ends with, on examples neither trained on.
  const double exact = plain.held_out_loss, averaged = local.held_out_loss;
  EXPECT_NEAR(averaged, exact, 0.03 * exact) << "plain " << exact << " local " << averaged;
  std::printf("held-out loss: plain DDP %.4f, local SGD period 8 %.4f\n", exact, averaged);
  // 580 - 20 = 560 local steps = 70 whole periods: the last step averaged.
  EXPECT_TRUE(BitEqual(local.parameters[1], local.parameters[0]));
  int64_t plain_bytes = 0, local_bytes = 0;
  for (size_t s = 20; s < plain.bytes.size(); ++s) {
    plain_bytes += plain.bytes[s];
    local_bytes += local.bytes[s];
  }
  EXPECT_EQ(local_bytes * 8, plain_bytes) << "one parameter average per 8 gradient allreduces";
}

// --- PowerSGD ---

TEST_F(EfficiencyTest, PowerSgdRank4LossWithin3PercentAndTenTimesFewerBytes) {
  RunSpec run;
  run.lr = 1e-4;  // Adam; SGD at a rate that learns this deep MLP in 200 steps diverges
  run.steps = 200;
  run.batch_per_rank = 16;
  run.widths = {784, 2048, 2048, 2048, 2048, 10};
  const Outcome exact = Train(run);
  PowerSgdOptions powersgd;
  powersgd.matrix_approximation_rank = 4;
  powersgd.start_iter = 10;
  run.powersgd = powersgd;
  const Outcome compressed = Train(run);
  const double exact_loss = MeanOfLast(exact.losses, 20);
  const double compressed_loss = MeanOfLast(compressed.losses, 20);
  EXPECT_NEAR(compressed_loss, exact_loss, 0.03 * exact_loss)
      << "uncompressed " << exact_loss << " PowerSGD " << compressed_loss << " (first loss "
      << exact.losses.front() << ")";
  // The task was learned: single-batch losses are noisy (16 examples), so means over steps.
  const double early = std::accumulate(exact.losses.begin(), exact.losses.begin() + 10, 0.0) / 10;
  EXPECT_LT(exact_loss, 0.92 * early)
      << "the task was not learned: " << early << " -> " << exact_loss;
  EXPECT_EQ(compressed.bytes[5], exact.bytes[5]) << "uncompressed before start_iter";
  EXPECT_GE(exact.bytes.back(), 10 * compressed.bytes.back())
      << exact.bytes.back() << " vs " << compressed.bytes.back();
  std::printf("PowerSGD rank 4: %lld vs %lld bytes per step (%.0fx), loss %.4f vs %.4f\n",
              static_cast<long long>(compressed.bytes.back()),
              static_cast<long long>(exact.bytes.back()),
              static_cast<double>(exact.bytes.back()) / compressed.bytes.back(), compressed_loss,
              exact_loss);
  EXPECT_TRUE(BitEqual(compressed.parameters[1], compressed.parameters[0]))
      << "every rank applies the same decompressed gradient";
}

}  // namespace
}  // namespace gradhub::ddp
