// Comm hooks (gpu_worker/ddp/comm_hook.h): a hook of the caller's own through the open
// interface, the cast hooks, and PowerSGD's per-rank state through Save and Load. Ranks are
// threads over an InMemoryStore with real Gloo groups.
#include <torch/torch.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "gpu_worker/ddp/comm_hook.h"
#include "gpu_worker/ddp/distributed_data_parallel.h"
#include "gpu_worker/ddp/powersgd.h"
#include "gpu_worker/ddp/store/in_memory_store.h"
#include "tests/unit/ddp/test_mlp.h"
#include "tests/unit/ddp/test_ranks.h"

namespace gradhub::ddp {
namespace {

using gradhub::testing::Mlp;

// Sums each bucket over the ranks instead of averaging it, and records what it was given.
class SumHook final : public CommHook {
 public:
  struct Launched {
    size_t index;
    size_t parameters;
    size_t gradients;
    int64_t buffer_numel;
  };

  std::string name() const override { return "sum"; }
  std::unique_ptr<PendingReduction> Launch(const GradBucket& bucket, ProcessGroup& group) override {
    launched.push_back(
        {bucket.index, bucket.parameters.size(), bucket.gradients.size(), bucket.buffer.numel()});
    // gradients[i] is parameters[i]'s, a view into the buffer, in buffer order.
    int64_t offset = 0;
    for (const at::Tensor& gradient : bucket.gradients) {
      EXPECT_EQ(gradient.data_ptr(), bucket.buffer.narrow(0, offset, 1).data_ptr());
      offset += gradient.numel();
    }
    EXPECT_EQ(offset, bucket.buffer.numel());
    return std::make_unique<Pending>(group.AllReduce(bucket.buffer, ReduceOp::kSum),
                                     static_cast<int64_t>(bucket.buffer.nbytes()));
  }
  void EndStep() override { ++steps; }

  std::vector<Launched> launched;
  int steps = 0;

 private:
  class Pending final : public PendingReduction {
   public:
    Pending(std::shared_ptr<Work> work, int64_t bytes) : work_(std::move(work)), bytes_(bytes) {}
    ReductionCost Finish() override {
      work_->Wait();
      return {work_->start_time(), work_->end_time(), bytes_};
    }

   private:
    std::shared_ptr<Work> work_;
    int64_t bytes_;
  };
};

// One model per rank, all from one seed, built here and not in the rank threads: those would
// race on the global generator.
std::vector<std::shared_ptr<Mlp>> Models(int n, const std::vector<int64_t>& widths) {
  std::vector<std::shared_ptr<Mlp>> models;
  for (int r = 0; r < n; ++r) {
    torch::manual_seed(3);
    models.push_back(std::make_shared<Mlp>(widths));
  }
  return models;
}

std::shared_ptr<ProcessGroup> Join(int rank, int size, std::shared_ptr<Store> store) {
  ProcessGroupOptions options;
  options.rank = rank;
  options.size = size;
  options.store = std::move(store);
  return CreateProcessGroup(options);
}

// One synchronized step of `ddp` on `model` with this rank's batch (all ones times rank + 1);
// the loss is the sum of the outputs, so each rank's gradient is known in closed form.
void Step(DistributedDataParallel& ddp, Mlp& model, int rank) {
  torch::Tensor x = torch::ones({3, 8}) * (rank + 1);
  ddp.ZeroGrad();
  torch::Tensor loss = ddp.Forward([&] { return model.forward(x).sum(); });
  ddp.Backward(loss);
}

TEST(CommHookTest, CallersOwnHookSeesEveryBucketInOrderAndDecidesTheGradient) {
  const int n = 2;
  auto store = std::make_shared<InMemoryStore>();
  const auto models = Models(n, {8, 64, 64, 4});
  testing::spawnThreads(n, [&](int rank) {
    const auto& model = models[rank];
    auto hook = std::make_shared<SumHook>();
    DdpOptions options;
    options.reducer.comm_hook = hook;
    options.reducer.first_bucket_bytes = 1 << 10;  // several buckets
    options.reducer.bucket_cap_bytes = 8 << 10;
    DistributedDataParallel ddp(model, Join(rank, n, store), options);
    EXPECT_EQ(ddp.comm_hook(), hook.get());

    Step(ddp, *model, rank);
    const size_t buckets = ddp.bucket_assignment().size();
    ASSERT_GE(buckets, 2u);
    ASSERT_EQ(hook->launched.size(), buckets);
    for (size_t b = 0; b < buckets; ++b) {
      EXPECT_EQ(hook->launched[b].index, b) << "launched out of bucket order";
      EXPECT_EQ(hook->launched[b].parameters, ddp.bucket_assignment()[b].size());
      EXPECT_EQ(hook->launched[b].gradients, hook->launched[b].parameters);
    }
    EXPECT_EQ(hook->steps, 1);
    EXPECT_EQ(ddp.last_reduction().buckets, static_cast<int>(buckets));
    EXPECT_GT(ddp.last_reduction().bytes, 0);

    // The hook's result is what the optimizer reads. For a loss that sums the outputs, the
    // last layer's bias gradient is the batch size, 3, on every rank: summed over two ranks
    // 6, where the average would be 3.
    const torch::Tensor last_bias_grad = model->layers.back()->bias.grad();
    EXPECT_TRUE(torch::allclose(last_bias_grad, torch::full({4}, 6.0))) << last_bias_grad;
    Step(ddp, *model, rank);
    EXPECT_EQ(hook->steps, 2);
  });
}

TEST(CommHookTest, AWorldOfOneEndsStepsWithoutLaunching) {
  auto model = Models(1, {8, 16, 4})[0];
  auto hook = std::make_shared<SumHook>();
  DdpOptions options;
  options.reducer.comm_hook = hook;
  DistributedDataParallel ddp(model, Join(0, 1, std::make_shared<InMemoryStore>()), options);
  Step(ddp, *model, 0);
  Step(ddp, *model, 0);
  EXPECT_TRUE(hook->launched.empty());
  EXPECT_EQ(hook->steps, 2);
}

TEST(CommHookTest, CastCompressHooksSendHalfTheBytesOfFloat32) {
  const int n = 2;
  for (at::ScalarType dtype : {at::kHalf, at::kBFloat16}) {
    SCOPED_TRACE(c10::toString(dtype));
    std::vector<int64_t> plain_bytes(n), compressed_bytes(n);
    std::vector<torch::Tensor> plain_grad(n), compressed_grad(n);
    for (bool compressed : {false, true}) {
      auto store = std::make_shared<InMemoryStore>();
      const auto models = Models(n, {8, 32, 4});
      testing::spawnThreads(n, [&](int rank) {
        const auto& model = models[rank];
        DdpOptions options;
        if (compressed) options.reducer.comm_hook = std::make_shared<CastCompressHook>(dtype);
        DistributedDataParallel ddp(model, Join(rank, n, store), options);
        Step(ddp, *model, rank);
        (compressed ? compressed_bytes : plain_bytes)[rank] = ddp.last_reduction().bytes;
        (compressed ? compressed_grad : plain_grad)[rank] = model->layers[0]->weight.grad().clone();
      });
    }
    for (int rank = 0; rank < n; ++rank) {
      EXPECT_EQ(compressed_bytes[rank] * 2, plain_bytes[rank]) << "rank " << rank;
      EXPECT_TRUE(torch::allclose(compressed_grad[rank], plain_grad[rank], 1e-2, 1e-2))
          << "rank " << rank;
    }
  }
}

TEST(CommHookTest, CastCompressHookRefusesOtherDtypesAndNamesItself) {
  EXPECT_THROW(CastCompressHook(at::kFloat), std::invalid_argument);
  EXPECT_EQ(CastCompressHook(at::kHalf).name(), "fp16");
  EXPECT_EQ(CastCompressHook(at::kBFloat16).name(), "bf16");
  EXPECT_FALSE(CastCompressHook(at::kHalf).has_state());
}

// Every tensor of `archive`, by key.
std::map<std::string, torch::Tensor> TensorsOf(const std::string& bytes) {
  torch::serialize::InputArchive archive;
  std::istringstream in(bytes);
  archive.load_from(in);
  std::map<std::string, torch::Tensor> tensors;
  for (const std::string& key : archive.keys()) archive.read(key, tensors[key]);
  return tensors;
}

std::string Saved(const CommHook& hook) {
  torch::serialize::OutputArchive archive;
  hook.Save(archive);
  std::ostringstream out;
  archive.save_to(out);
  return out.str();
}

TEST(CommHookTest, PowerSgdStateIsPerRankAndSurvivesSaveAndLoad) {
  const int n = 2;
  PowerSgdOptions powersgd;
  powersgd.start_iter = 1;
  powersgd.min_compression_rate = 1;
  std::vector<std::string> saved(n);
  auto store = std::make_shared<InMemoryStore>();
  const auto models = Models(n, {8, 32, 32, 4});
  testing::spawnThreads(n, [&](int rank) {
    const auto& model = models[rank];
    DdpOptions options;
    options.reducer.comm_hook = std::make_shared<PowerSgdHook>(powersgd);  // one per rank
    DistributedDataParallel ddp(model, Join(rank, n, store), options);
    for (int step = 0; step < 3; ++step) Step(ddp, *model, rank);
    ASSERT_NE(ddp.comm_hook(), nullptr);
    EXPECT_TRUE(ddp.comm_hook()->has_state());
    EXPECT_EQ(ddp.comm_hook()->name(), "powersgd");
    saved[rank] = Saved(*ddp.comm_hook());
  });
  const auto rank0 = TensorsOf(saved[0]), rank1 = TensorsOf(saved[1]);
  EXPECT_EQ(rank0.at("iter").item<int64_t>(), 3);
  // Error feedback for the three weight matrices, and their Qs for the warm start.
  EXPECT_EQ(rank0.count("error_0") + rank0.count("error_2") + rank0.count("error_4"), 3u);
  EXPECT_EQ(rank0.count("q_0") + rank0.count("q_2") + rank0.count("q_4"), 3u);
  // Per rank: the local errors differ (each rank compressed its own gradient).
  EXPECT_FALSE(torch::equal(rank0.at("error_0"), rank1.at("error_0")));

  PowerSgdHook restored(powersgd);
  torch::serialize::InputArchive archive;
  std::istringstream in(saved[0]);
  archive.load_from(in);
  restored.Load(archive);
  EXPECT_EQ(restored.iter(), 3);
  const auto again = TensorsOf(Saved(restored));
  ASSERT_EQ(again.size(), rank0.size());
  for (const auto& [key, tensor] : rank0) {
    EXPECT_TRUE(torch::equal(again.at(key), tensor)) << key;
  }
}

}  // namespace
}  // namespace gradhub::ddp
