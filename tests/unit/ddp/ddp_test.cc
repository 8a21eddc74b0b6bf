// DistributedDataParallel at world size N must compute what one process computes on the
// concatenated batch. Ranks are threads over an InMemoryStore with real Gloo groups.
#include <torch/torch.h>

#include <gtest/gtest.h>

#include <memory>
#include <optional>

#include "gpu_worker/ddp/comm/gloo/gloo_process_group.h"
#include "gpu_worker/ddp/distributed_data_parallel.h"
#include "gpu_worker/ddp/store/in_memory_store.h"
#include "gpu_worker/ddp/sync_batch_norm.h"
#include "tests/unit/ddp/test_mlp.h"
#include "tests/unit/ddp/test_ranks.h"

namespace gradhub::ddp {
namespace {

constexpr int kSteps = 20;
constexpr int kBatchPerRank = 8;
constexpr double kTolerance = 1e-5;

using gradhub::testing::Mlp;

// Conv -> SyncBatchNorm -> ReLU -> pool -> Linear, for 1x8x8 images. `group` is null for the
// single-process reference, where SyncBatchNorm is plain BatchNorm.
struct SmallCnn : torch::nn::Module {
  explicit SmallCnn(std::shared_ptr<ProcessGroup> group)
      : conv(register_module("conv",
                             torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 4, 3).padding(1)))),
        norm(register_module("norm", SyncBatchNorm(SyncBatchNormOptions{4}, std::move(group)))),
        fc(register_module("fc", torch::nn::Linear(4 * 4 * 4, 10))) {}
  torch::Tensor forward(torch::Tensor x) {
    x = torch::max_pool2d(torch::relu(norm->forward(conv->forward(x))), 2);
    return fc->forward(x.flatten(1));
  }
  torch::nn::Conv2d conv;
  SyncBatchNorm norm;
  torch::nn::Linear fc;
};

// The global batch of one step: inputs and class labels, the same on every rank.
struct Batch {
  torch::Tensor x, y;
  Batch Slice(int64_t start, int64_t length) const {
    return {x.narrow(0, start, length), y.narrow(0, start, length)};
  }
};

using InputShape = std::vector<int64_t>;

Batch MakeBatch(int step, int64_t size, const InputShape& sample_shape, int64_t classes) {
  auto generator = at::detail::createCPUGenerator(1000 + step);
  InputShape shape = {size};
  shape.insert(shape.end(), sample_shape.begin(), sample_shape.end());
  return {torch::randn(shape, generator), torch::randint(classes, {size}, generator)};
}

double MaxAbsDifference(torch::nn::Module& a, torch::nn::Module& b) {
  auto pa = a.parameters(), pb = b.parameters();
  double worst = 0;
  for (size_t i = 0; i < pa.size(); ++i) {
    worst = std::max(worst, (pa[i] - pb[i]).abs().max().item<double>());
  }
  return worst;
}

struct Scenario {
  int world_size = 2;
  int micro_batches = 1;  // >1: accumulate with NoSync
  DdpOptions options;
  InputShape sample_shape = {8};
  int64_t classes = 4;
  int steps = kSteps;
  // The ranks' Gloo settings; unset = the defaults.
  std::optional<GlooOptions> gloo;
};

// Trains `replicas[r]` on rank r's share of every step's global batch.
void TrainDistributed(const Scenario& scenario,
                      std::vector<std::shared_ptr<torch::nn::Module>> replicas,
                      std::function<torch::Tensor(torch::nn::Module&, torch::Tensor)> forward,
                      std::vector<std::vector<double>>* losses = nullptr) {
  const int n = scenario.world_size;
  auto store = std::make_shared<InMemoryStore>();
  if (losses) losses->assign(n, {});
  testing::spawnThreads(n, [&](int rank) {
    ProcessGroupOptions options;
    options.rank = rank;
    options.size = n;
    options.store = store;
    options.gloo = scenario.gloo;
    auto group = CreateProcessGroup(options);
    auto& model = replicas[rank];
    DistributedDataParallel ddp(model, group, scenario.options);
    torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
    const int64_t micro = kBatchPerRank;
    for (int step = 0; step < scenario.steps; ++step) {
      Batch global = MakeBatch(step, micro * n * scenario.micro_batches, scenario.sample_shape,
                               scenario.classes);
      ddp.ZeroGrad();
      for (int m = 0; m < scenario.micro_batches; ++m) {
        Batch mine = global.Slice((m * n + rank) * micro, micro);
        auto run = [&] {
          torch::Tensor loss = ddp.Forward([&] {
            return torch::cross_entropy_loss(forward(*model, mine.x), mine.y) /
                   scenario.micro_batches;
          });
          ddp.Backward(loss);
          if (losses && rank == 0) (*losses)[rank].push_back(loss.item<double>());
        };
        if (m + 1 < scenario.micro_batches) {
          auto no_sync = ddp.NoSync();
          run();
        } else {
          run();
        }
      }
      optimizer.step();
    }
    // On one host the gradients are views into buckets in shared memory, reduced in place
    // (gloo/shared_memory_buffers.h): the equivalence above covers that path.
    auto* gloo = dynamic_cast<GlooProcessGroup*>(group.get());
    if (gloo != nullptr && gloo->uses_shared_memory()) {
      for (const auto& parameter : model->parameters()) {
        EXPECT_TRUE(gloo->ReducesInPlace(parameter.grad())) << "rank " << rank;
      }
    }
  });
}

void TrainReference(const Scenario& scenario, torch::nn::Module& model,
                    std::function<torch::Tensor(torch::nn::Module&, torch::Tensor)> forward) {
  torch::optim::SGD optimizer(model.parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  for (int step = 0; step < scenario.steps; ++step) {
    Batch global = MakeBatch(step, kBatchPerRank * scenario.world_size * scenario.micro_batches,
                             scenario.sample_shape, scenario.classes);
    optimizer.zero_grad();
    torch::cross_entropy_loss(forward(model, global.x), global.y).backward();
    optimizer.step();
  }
}

torch::Tensor MlpForward(torch::nn::Module& m, torch::Tensor x) {
  return static_cast<Mlp&>(m).forward(x);
}

// Checks every replica against a reference trained on the whole batch in one process.
void ExpectMlpEquivalence(const Scenario& scenario, std::vector<int64_t> widths = {8, 32, 32, 4}) {
  torch::manual_seed(7);
  auto reference = std::make_shared<Mlp>(widths);
  std::vector<std::shared_ptr<torch::nn::Module>> replicas;
  for (int r = 0; r < scenario.world_size; ++r) {
    // Different initial weights per rank: construction must replace them with rank 0's.
    torch::manual_seed(r == 0 ? 7 : 100 + r);
    replicas.push_back(std::make_shared<Mlp>(widths));
  }
  TrainDistributed(scenario, replicas, MlpForward);
  TrainReference(scenario, *reference, MlpForward);
  for (int r = 0; r < scenario.world_size; ++r) {
    EXPECT_LE(MaxAbsDifference(*replicas[r], *reference), kTolerance) << "rank " << r;
  }
  // And the run really moved the weights: the comparison is not between two untouched models.
  torch::manual_seed(7);
  Mlp untouched(widths);
  EXPECT_GT(MaxAbsDifference(untouched, *reference), 1e-3);
}

class DdpTest : public ::testing::Test {
 protected:
  void SetUp() override { at::set_num_threads(1); }
};

TEST_F(DdpTest, MlpWorldSize2EqualsSingleProcess) { ExpectMlpEquivalence({}); }

TEST_F(DdpTest, MlpWorldSize3EqualsSingleProcess) {
  Scenario scenario;
  scenario.world_size = 3;
  ExpectMlpEquivalence(scenario);
}

// Every gradient bucket (and the parameter broadcast at construction) sealed over TCP.
TEST_F(DdpTest, EncryptedTrafficWorldSizes2And3EqualSingleProcess) {
  for (int world : {2, 3}) {
    SCOPED_TRACE(::testing::Message() << world << " ranks");
    Scenario scenario;
    scenario.world_size = world;
    scenario.gloo.emplace().shared_memory = false;
    scenario.gloo->encrypt_traffic = true;
    scenario.options.reducer.first_bucket_bytes = 512;  // several buckets: several collectives
    scenario.options.reducer.bucket_cap_bytes = 2048;
    ExpectMlpEquivalence(scenario, {8, 32, 32, 32, 4});
  }
}

TEST_F(DdpTest, NoSyncAccumulationOverFourMicroBatches) {
  Scenario scenario;
  scenario.micro_batches = 4;
  ExpectMlpEquivalence(scenario);
}

TEST_F(DdpTest, ManySmallBucketsGiveTheSameResult) {
  Scenario scenario;
  scenario.options.reducer.first_bucket_bytes = 512;
  scenario.options.reducer.bucket_cap_bytes = 2048;
  ExpectMlpEquivalence(scenario, {8, 32, 32, 32, 4});
}

TEST_F(DdpTest, CnnWithSyncBatchNormEqualsSingleProcess) {
  Scenario scenario;
  scenario.sample_shape = {1, 8, 8};
  scenario.classes = 10;
  auto forward = [](torch::nn::Module& m, torch::Tensor x) {
    return static_cast<SmallCnn&>(m).forward(x);
  };
  torch::manual_seed(11);
  auto reference = std::make_shared<SmallCnn>(nullptr);
  auto store = std::make_shared<InMemoryStore>();
  std::vector<std::shared_ptr<torch::nn::Module>> replicas;
  std::vector<std::shared_ptr<SmallCnn>> cnns;
  // Groups for SyncBatchNorm are made inside the ranks; replicas get them through a holder.
  std::vector<std::shared_ptr<ProcessGroup>> groups(scenario.world_size);
  testing::spawnThreads(scenario.world_size, [&](int rank) {
    ProcessGroupOptions options;
    options.rank = rank;
    options.size = scenario.world_size;
    options.store = store;
    options.name = "batchnorm";
    groups[rank] = CreateProcessGroup(options);
  });
  for (int r = 0; r < scenario.world_size; ++r) {
    torch::manual_seed(11);
    cnns.push_back(std::make_shared<SmallCnn>(groups[r]));
    replicas.push_back(cnns.back());
  }
  TrainDistributed(scenario, replicas, forward);
  TrainReference(scenario, *reference, forward);
  for (int r = 0; r < scenario.world_size; ++r) {
    EXPECT_LE(MaxAbsDifference(*cnns[r], *reference), kTolerance) << "rank " << r;
    EXPECT_LE(
        (cnns[r]->norm->running_mean - reference->norm->running_mean).abs().max().item<double>(),
        kTolerance);
    EXPECT_LE(
        (cnns[r]->norm->running_var - reference->norm->running_var).abs().max().item<double>(),
        kTolerance);
  }
}

TEST_F(DdpTest, SyncBatchNormWithoutGroupMatchesTorchBatchNorm) {
  torch::manual_seed(3);
  SyncBatchNorm ours(SyncBatchNormOptions{5}, nullptr);
  torch::nn::BatchNorm2d theirs(5);
  torch::Tensor x = torch::randn({6, 5, 3, 3}, torch::requires_grad());
  torch::Tensor weights = torch::randn({6, 5, 3, 3});
  torch::Tensor x2 = x.detach().clone().requires_grad_(true);
  (ours->forward(x) * weights).sum().backward();
  (theirs->forward(x2) * weights).sum().backward();
  EXPECT_TRUE(torch::allclose(x.grad(), x2.grad(), 1e-5, 1e-6));
  EXPECT_TRUE(torch::allclose(ours->weight.grad(), theirs->weight.grad(), 1e-5, 1e-6));
  EXPECT_TRUE(torch::allclose(ours->bias.grad(), theirs->bias.grad(), 1e-5, 1e-6));
  EXPECT_TRUE(torch::allclose(ours->running_var, theirs->running_var, 1e-5, 1e-6));
}

TEST_F(DdpTest, FirstBucketAllreduceStartsBeforeBackwardEnds) {
  const int n = 2;
  auto store = std::make_shared<InMemoryStore>();
  std::vector<ReductionStats> stats(n);
  std::vector<size_t> buckets(n);
  testing::spawnThreads(n, [&](int rank) {
    ProcessGroupOptions options;
    options.rank = rank;
    options.size = n;
    options.store = store;
    torch::manual_seed(1);
    auto model = std::make_shared<Mlp>(std::vector<int64_t>{256, 512, 512, 512, 512, 10});
    DdpOptions ddp_options;
    ddp_options.reducer.first_bucket_bytes = 256 << 10;
    ddp_options.reducer.bucket_cap_bytes = 1 << 20;
    DistributedDataParallel ddp(model, CreateProcessGroup(options), ddp_options);
    Batch batch = MakeBatch(rank, 64, {256}, 10);
    for (int step = 0; step < 3; ++step) {
      ddp.ZeroGrad();
      torch::Tensor loss =
          ddp.Forward([&] { return torch::cross_entropy_loss(model->forward(batch.x), batch.y); });
      ddp.Backward(loss);
    }
    stats[rank] = ddp.last_reduction();
    buckets[rank] = ddp.bucket_assignment().size();
  });
  for (int rank = 0; rank < n; ++rank) {
    ASSERT_GE(buckets[rank], 3u);
    ASSERT_EQ(stats[rank].bucket_start_times.size(), buckets[rank]);
    EXPECT_LT(stats[rank].bucket_start_times.front(), stats[rank].last_gradient_time)
        << "the first bucket was not reduced while backward ran";
    EXPECT_GT(stats[rank].bytes, 0);
  }
}

TEST_F(DdpTest, Fp16HookLossWithinTwoPercent) {
  auto final_loss = [](std::shared_ptr<CommHook> hook) {
    Scenario scenario;
    scenario.steps = 100;
    scenario.options.reducer.comm_hook = hook;
    torch::manual_seed(5);
    std::vector<std::shared_ptr<torch::nn::Module>> replicas;
    for (int r = 0; r < scenario.world_size; ++r) {
      torch::manual_seed(5);
      replicas.push_back(std::make_shared<Mlp>(std::vector<int64_t>{8, 32, 32, 4}));
    }
    std::vector<std::vector<double>> losses;
    TrainDistributed(scenario, replicas, MlpForward, &losses);
    // The mean of the last 10 steps, so one noisy batch does not decide.
    double sum = 0;
    for (size_t i = losses[0].size() - 10; i < losses[0].size(); ++i) sum += losses[0][i];
    return sum / 10;
  };
  const double exact = final_loss(nullptr);
  const double fp16 = final_loss(std::make_shared<CastCompressHook>(at::kHalf));
  const double bf16 = final_loss(std::make_shared<CastCompressHook>(at::kBFloat16));
  EXPECT_NEAR(fp16, exact, 0.02 * exact);
  EXPECT_NEAR(bf16, exact, 0.05 * exact);
}

struct Branchy : torch::nn::Module {
  Branchy()
      : used(register_module("used", torch::nn::Linear(4, 2))),
        unused(register_module("unused", torch::nn::Linear(4, 2))) {}
  torch::nn::Linear used, unused;
};

TEST_F(DdpTest, UnusedParametersNeedFindUnused) {
  for (bool find_unused : {false, true}) {
    auto store = std::make_shared<InMemoryStore>();
    std::vector<std::string> errors(2);
    testing::spawnThreads(2, [&](int rank) {
      ProcessGroupOptions options;
      options.rank = rank;
      options.size = 2;
      options.store = store;
      auto model = std::make_shared<Branchy>();
      DdpOptions ddp_options;
      ddp_options.reducer.find_unused_parameters = find_unused;
      DistributedDataParallel ddp(model, CreateProcessGroup(options), ddp_options);
      torch::Tensor x = torch::ones({3, 4}) * (rank + 1);
      try {
        torch::Tensor loss = ddp.Forward([&] { return model->used->forward(x).sum(); });
        ddp.Backward(loss);
        // Rank r's gradient is (r + 1) * 3 per weight; the average over two ranks is 4.5.
        EXPECT_TRUE(torch::allclose(model->used->weight.grad(), torch::full({2, 4}, 4.5)));
        EXPECT_EQ(model->unused->weight.grad().abs().sum().item<double>(), 0);
      } catch (const std::logic_error& error) {
        errors[rank] = error.what();
      }
    });
    for (const std::string& error : errors) {
      if (find_unused) {
        EXPECT_EQ(error, "");
      } else {
        EXPECT_NE(error.find("unused.weight"), std::string::npos) << error;
        EXPECT_NE(error.find("find_unused_parameters"), std::string::npos) << error;
      }
    }
  }
}

// finalize_at_end_of_backward: loss.backward() alone returns with averaged gradients (the
// first gradient queued Finalize on the autograd engine), step after step.
TEST_F(DdpTest, ReducerFinalizesAtEndOfBackward) {
  auto store = std::make_shared<InMemoryStore>();
  testing::spawnThreads(2, [&](int rank) {
    ProcessGroupOptions options;
    options.rank = rank;
    options.size = 2;
    options.store = store;
    torch::nn::Linear layer(4, 2);
    ReducerOptions reducer_options;
    reducer_options.finalize_at_end_of_backward = true;
    Reducer reducer(layer->parameters(), {"weight", "bias"}, CreateProcessGroup(options),
                    reducer_options);
    for (int step = 1; step <= 3; ++step) {
      reducer.ZeroGrad();
      torch::Tensor output = layer->forward(torch::ones({3, 4}) * (rank + 1) * step);
      reducer.Prepare({output});
      output.sum().backward();
      // Rank r's weight gradient is 3 (r + 1) step; the average over two ranks is 4.5 step.
      EXPECT_TRUE(torch::allclose(layer->weight.grad(), torch::full({2, 4}, 4.5 * step)));
      EXPECT_EQ(reducer.last_stats().buckets, 1);
    }
  });
}

// With finalize_at_end_of_backward, a prepared step whose forward never went through backward
// (evaluation with grad mode on) is armed again by the next Prepare; without it, that is a bug
// in the caller and Prepare says so.
TEST_F(DdpTest, ReducerRearmsOnlyAStepThatNeverStarted) {
  for (bool at_end : {true, false}) {
    auto store = std::make_shared<InMemoryStore>();
    testing::spawnThreads(1, [&](int rank) {
      ProcessGroupOptions options;
      options.store = store;
      torch::nn::Linear layer(4, 2);
      ReducerOptions reducer_options;
      reducer_options.finalize_at_end_of_backward = at_end;
      Reducer reducer(layer->parameters(), {"weight", "bias"}, CreateProcessGroup(options),
                      reducer_options);
      torch::Tensor unused_output = layer->forward(torch::ones({1, 4}));
      reducer.Prepare({unused_output});
      if (at_end) {
        EXPECT_NO_THROW(reducer.Prepare({layer->forward(torch::ones({1, 4}))}));
      } else {
        EXPECT_THROW(reducer.Prepare({layer->forward(torch::ones({1, 4}))}), std::logic_error);
      }
    });
  }
}

TEST_F(DdpTest, MismatchedParametersAreNamed) {
  auto store = std::make_shared<InMemoryStore>();
  std::vector<std::string> errors(2);
  testing::spawnThreads(2, [&](int rank) {
    ProcessGroupOptions options;
    options.rank = rank;
    options.size = 2;
    options.store = store;
    auto model = std::make_shared<Mlp>(std::vector<int64_t>{8, rank == 0 ? 16 : 12, 4});
    try {
      DistributedDataParallel ddp(model, CreateProcessGroup(options));
    } catch (const std::invalid_argument& error) {
      errors[rank] = error.what();
    }
  });
  for (const std::string& error : errors) {
    EXPECT_NE(error.find("fc0.weight"), std::string::npos) << error;
    EXPECT_NE(error.find("[16, 8]"), std::string::npos) << error;
    EXPECT_NE(error.find("[12, 8]"), std::string::npos) << error;
  }
}

}  // namespace
}  // namespace gradhub::ddp
