// A 2-stage pipeline over NCCL send/recv (issue 33's GPU acceptance; tests/gpu/run.sh runs it
// on a machine with two GPUs). Two ranks, threads of this process with one GPU each (rank r on
// cuda:r, as nccl_process_group_test starts its ranks):
//  - a 4-layer MLP split into 2 stages of 2 layers, trained 20 steps with GPipe and with 1F1B
//    (M = 4 micro-batches, SGD with momentum), ends with every parameter within 1e-5 of the
//    unsplit model trained in one process on cuda:0 on the whole batch (float32, TF32 off), and
//    stage 0 reports the same loss each step (what tests/unit/ddp/pipeline_test checks on Gloo);
//  - point to point alone: a tensor sent around the ring of the two ranks and back, each rank
//    adding 1 on its GPU between receive and send; and many float32 and bfloat16 messages in
//    flight each way at once, posted in the order NCCL's one stream per rank needs.
// Every case also runs on Gloo on the CPU, so that the program runs (in ctest) where there is
// no GPU; the NCCL cases are skipped there, naming why. Prints "pipeline <backend>
// <schedule>: max |parameter - single process| <x>" lines for run.sh's table.
#include <torch/torch.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "gpu_worker/ddp/comm/process_group.h"
#include "gpu_worker/ddp/pipeline/pipeline_stage.h"
#include "gpu_worker/ddp/store/in_memory_store.h"
#include "gradhub/build_config.h"
#include "tests/unit/ddp/test_ranks.h"

namespace gradhub::ddp::pipeline {
namespace {

enum class Transport { kGloo, kNccl };

constexpr int kRanks = 2;  // = stages: one replica
constexpr int kMicroBatches = 4;
constexpr int kSteps = 20;
constexpr int64_t kBatch = 32;
constexpr double kTolerance = 1e-5;
// The MLP's widths: 4 Linear layers, a ReLU after each but the last (7 modules). Stage 0 holds
// modules [0, kStageCut): two Linear layers and their ReLUs; stage 1 the rest.
const std::vector<int64_t> kWidths = {16, 64, 64, 64, 8};
constexpr size_t kStageCut = 4;

const char* TransportName(Transport transport) {
  return transport == Transport::kNccl ? "nccl" : "gloo";
}

// Why `transport`'s cases cannot run here; "" when they can.
std::string Unavailable(Transport transport) {
  if (transport == Transport::kGloo) return "";
#if !GRADHUB_HAVE_NCCL
  return "this build has no NCCL (cmake/GradhubCuda.cmake found no CUDA runtime or nccl.h)";
#else
  if (!torch::cuda::is_available()) {
    return "this libtorch has no CUDA (the stages' layers run on the GPUs through it)";
  }
  const size_t gpus = torch::cuda::device_count();
  if (gpus < static_cast<size_t>(kRanks)) {
    return "needs 2 GPUs, this machine has " + std::to_string(gpus);
  }
  return "";
#endif
}

c10::Device DeviceOf(Transport transport, int rank) {
  if (transport == Transport::kGloo) return c10::Device(c10::kCPU);
  return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(rank));
}

std::shared_ptr<ProcessGroup> JoinGroup(Transport transport, std::shared_ptr<Store> store,
                                        int rank) {
  ProcessGroupOptions options;
  options.rank = rank;
  options.size = kRanks;
  options.store = std::move(store);
  options.timeout = std::chrono::seconds(60);  // NCCL's first connections take seconds
  if (transport == Transport::kNccl) {
    options.backend = Backend::kNccl;
    options.nccl = NcclOptions{rank};
  }
  return CreateProcessGroup(options);
}

// --- the model and its training ---

torch::nn::Sequential MakeMlp() {
  torch::nn::Sequential model;
  for (size_t i = 0; i + 1 < kWidths.size(); ++i) {
    model->push_back(torch::nn::Linear(kWidths[i], kWidths[i + 1]));
    if (i + 2 < kWidths.size()) model->push_back(torch::nn::ReLU());
  }
  return model;
}

// Modules [first, last) of `model`, copied onto `device`: one stage, or (all of them) the
// single-process reference.
torch::nn::Sequential Slice(const torch::nn::Sequential& model, size_t first, size_t last,
                            c10::Device device) {
  torch::nn::Sequential piece;
  for (auto module = model->begin() + first; module != model->begin() + last; ++module) {
    piece->push_back(module->clone(device));
  }
  return piece;
}

struct Batch {
  at::Tensor x, y;
};

// The same global batch of `step` on every device: drawn on the CPU, then copied.
Batch MakeBatch(int step, c10::Device device) {
  auto generator = at::detail::createCPUGenerator(1000 + step);
  at::Tensor x = torch::randn({kBatch, kWidths.front()}, generator);
  at::Tensor y = torch::randint(kWidths.back(), {kBatch}, generator);
  return {x.to(device), y.to(device)};
}

at::Tensor CrossEntropy(const at::Tensor& output, const at::Tensor& target) {
  return torch::cross_entropy_loss(output, target);
}

torch::optim::SGDOptions Sgd() { return torch::optim::SGDOptions(0.05).momentum(0.9); }

// The unsplit model trained in one process on the whole batch: each step's loss.
std::vector<double> TrainReference(torch::nn::Sequential& model, c10::Device device) {
  torch::optim::SGD optimizer(model->parameters(), Sgd());
  std::vector<double> losses;
  for (int step = 0; step < kSteps; ++step) {
    const Batch batch = MakeBatch(step, device);
    optimizer.zero_grad();
    at::Tensor loss = CrossEntropy(model->forward(batch.x), batch.y);
    loss.backward();
    optimizer.step();
    losses.push_back(loss.item<double>());
  }
  return losses;
}

// Rank `rank`'s stage, `piece`, trained kSteps through a PipelineStage: the loss it reports
// each step (both stages of a 2-stage pipeline report one).
std::vector<double> TrainStage(Transport transport, PipelineSchedule schedule,
                               std::shared_ptr<Store> store, int rank,
                               torch::nn::Sequential& piece) {
  const auto group = JoinGroup(transport, std::move(store), rank);
  const PipelineStageOptions options{schedule, kMicroBatches, 1, DeviceOf(transport, rank)};
  PipelineStage stage(group, PipelineLayout(kRanks, kRanks), options,
                      {StageChunk{[&piece](const at::Tensor& x) { return piece->forward(x); }}},
                      CrossEntropy);
  torch::optim::SGD optimizer(piece->parameters(), Sgd());
  std::vector<double> losses;
  for (int step = 0; step < kSteps; ++step) {
    const Batch batch = MakeBatch(step, options.device);  // stage 0 reads x, stage 1 y
    optimizer.zero_grad();
    const StageStepReport report = stage.Step({batch.x, batch.y});
    optimizer.step();
    losses.push_back(report.loss.item<double>());
  }
  return losses;
}

// The largest |a - b| over two lists of parameters, position by position.
double MaxDifference(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    worst = std::max(worst, (a[i].cpu() - b[i].cpu()).abs().max().item<double>());
  }
  return worst;
}

std::vector<at::Tensor> ParametersOf(const std::vector<torch::nn::Sequential>& pieces) {
  std::vector<at::Tensor> parameters;
  for (const auto& piece : pieces) {
    for (const auto& p : piece->parameters()) parameters.push_back(p);
  }
  return parameters;
}

using Scenario = std::tuple<Transport, PipelineSchedule>;

class PipelineEquivalenceTest : public ::testing::TestWithParam<Scenario> {
 protected:
  void SetUp() override {
    const std::string reason = Unavailable(std::get<0>(GetParam()));
    if (!reason.empty()) GTEST_SKIP() << reason;
    at::set_num_threads(1);
    at::globalContext().setAllowTF32CuBLAS(false);  // float32 matmuls in float32 on the GPU
  }
};

TEST_P(PipelineEquivalenceTest, EqualsSingleProcessTraining) {
  const auto [transport, schedule] = GetParam();
  torch::manual_seed(7);
  const torch::nn::Sequential initial = MakeMlp();
  std::vector<torch::nn::Sequential> pieces = {
      Slice(initial, 0, kStageCut, DeviceOf(transport, 0)),
      Slice(initial, kStageCut, initial->size(), DeviceOf(transport, 1))};
  std::vector<std::vector<double>> losses(kRanks);
  auto store = std::make_shared<InMemoryStore>();
  testing::spawnThreads(kRanks, [&](int rank) {
    losses[rank] = TrainStage(transport, schedule, store, rank, pieces[rank]);
  });

  torch::nn::Sequential reference = Slice(initial, 0, initial->size(), DeviceOf(transport, 0));
  const std::vector<double> expected = TrainReference(reference, DeviceOf(transport, 0));
  const double worst = MaxDifference(ParametersOf(pieces), reference->parameters());
  EXPECT_LE(worst, kTolerance);
  EXPECT_GT(MaxDifference(initial->parameters(), reference->parameters()), 1e-3)
      << "nothing trained";
  for (int step = 0; step < kSteps; ++step) {
    EXPECT_NEAR(losses[0][step], expected[step], kTolerance) << "step " << step;
    EXPECT_EQ(losses[0][step], losses[1][step]) << "step " << step;
  }
  std::printf("pipeline %s %s: max |parameter - single process| %.2e after %d steps\n",
              TransportName(transport), PipelineScheduleName(schedule), worst, kSteps);
}

std::string ScenarioName(const ::testing::TestParamInfo<Scenario>& info) {
  return std::get<1>(info.param) == PipelineSchedule::kGPipe ? "GPipe" : "OneFOneB";
}

INSTANTIATE_TEST_SUITE_P(Gloo, PipelineEquivalenceTest,
                         ::testing::Combine(::testing::Values(Transport::kGloo),
                                            ::testing::Values(PipelineSchedule::kGPipe,
                                                              PipelineSchedule::kOneFOneB)),
                         ScenarioName);
INSTANTIATE_TEST_SUITE_P(Nccl, PipelineEquivalenceTest,
                         ::testing::Combine(::testing::Values(Transport::kNccl),
                                            ::testing::Values(PipelineSchedule::kGPipe,
                                                              PipelineSchedule::kOneFOneB)),
                         ScenarioName);

// --- point to point alone ---

// Message k from `rank`: small integers (at most 60 + 64 + k), exact in bfloat16.
at::Tensor Message(at::ScalarType dtype, int64_t numel, int rank, int k, c10::Device device) {
  return (torch::arange(numel, torch::kLong).remainder(61) + 64 * rank + k).to(device, dtype);
}

// The largest message: past NCCL's point-to-point buffers (a few MiB), so that sends wait for
// their receives; small on Gloo, whose loopback copies would take most of the test's time.
int64_t LargestMessage(Transport transport) {
  return transport == Transport::kNccl ? int64_t{1} << 22 : int64_t{1} << 16;
}

class PointToPointTest : public ::testing::TestWithParam<Transport> {
 protected:
  void SetUp() override {
    const std::string reason = Unavailable(GetParam());
    if (!reason.empty()) GTEST_SKIP() << reason;
  }

  // Runs fn(group, device) on both ranks, each on its own thread and device.
  void OnBothRanks(const std::function<void(ProcessGroup& group, c10::Device device)>& fn) {
    auto store = std::make_shared<InMemoryStore>();
    testing::spawnThreads(kRanks, [&](int rank) {
      const auto group = JoinGroup(GetParam(), store, rank);
      fn(*group, DeviceOf(GetParam(), rank));
    });
  }
};

// 0 -> 1 -> 0, kLaps times: each rank adds 1 to what it received before sending it on, so the
// transfers and the compute between them must be ordered on each device (the send waits for
// the addition's kernel, the addition for the receive).
void RingLaps(ProcessGroup& group, c10::Device device, at::ScalarType dtype, int64_t numel) {
  constexpr int kLaps = 8;
  const int peer = 1 - group.rank();
  const at::Tensor start = Message(dtype, numel, 0, 0, device);
  at::Tensor held = start.clone();
  std::vector<std::pair<std::shared_ptr<Work>, at::Tensor>> sends;  // tensors alive until sent
  for (int lap = 0; lap < kLaps; ++lap) {
    const auto tag = static_cast<uint32_t>(lap);
    if (group.rank() == 0) sends.emplace_back(group.Send(held, peer, tag), held);
    at::Tensor received = at::empty_like(held);
    group.Recv(received, peer, tag)->Wait();
    held = received + 1;
    if (group.rank() == 1) sends.emplace_back(group.Send(held, peer, tag), held);
  }
  for (auto& send : sends) send.first->Wait();
  if (group.rank() == 0) {
    EXPECT_TRUE(torch::equal(held.cpu(), (start + 2 * kLaps).cpu()))
        << c10::toString(dtype) << ", " << numel << " elements";
  }
}

TEST_P(PointToPointTest, ATensorGoesAroundTheRingAndBack) {
  const int64_t largest = LargestMessage(GetParam());
  OnBothRanks([largest](ProcessGroup& group, c10::Device device) {
    for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
      for (int64_t numel : {int64_t{1}, int64_t{5000}, largest}) {
        RingLaps(group, device, dtype, numel);
      }
    }
  });
}

TEST_P(PointToPointTest, ManyMessagesInFlightEachWay) {
  // Every transfer is posted before any is waited for, in Megatron-LM's order: rank 0 sends and
  // then receives, rank 1 receives and then sends. (Both sending first would deadlock NCCL's
  // one stream per rank until the timeout: each send waits for a receive queued behind the
  // peer's own send.) float32 and bfloat16, from 1 element to 16 MiB on NCCL.
  const int64_t largest = LargestMessage(GetParam());
  const std::vector<int64_t> sizes = {1, 1000, largest / 4, largest};
  OnBothRanks([&](ProcessGroup& group, c10::Device device) {
    const int rank = group.rank(), peer = 1 - rank;
    std::vector<at::Tensor> outgoing, incoming;
    for (size_t k = 0; k < 2 * sizes.size(); ++k) {
      const at::ScalarType dtype = k % 2 ? at::kBFloat16 : at::kFloat;
      outgoing.push_back(Message(dtype, sizes[k / 2], rank, static_cast<int>(k), device));
      incoming.push_back(at::empty_like(outgoing.back()));
    }
    std::vector<std::shared_ptr<Work>> works;
    const auto post = [&](bool sending) {
      for (size_t k = 0; k < outgoing.size(); ++k) {
        const auto tag = static_cast<uint32_t>(k);
        works.push_back(sending ? group.Send(outgoing[k], peer, tag)
                                : group.Recv(incoming[k], peer, tag));
      }
    };
    post(/*sending=*/rank % 2 == 0);
    post(/*sending=*/rank % 2 == 1);
    for (auto& work : works) work->Wait();
    for (size_t k = 0; k < incoming.size(); ++k) {
      const at::Tensor want = Message(incoming[k].scalar_type(), incoming[k].numel(), peer,
                                      static_cast<int>(k), c10::Device(c10::kCPU));
      EXPECT_TRUE(torch::equal(incoming[k].cpu(), want)) << "message " << k << " on rank " << rank;
    }
  });
}

std::string TransportParamName(const ::testing::TestParamInfo<Transport>& info) {
  return TransportName(info.param);
}

INSTANTIATE_TEST_SUITE_P(Gloo, PointToPointTest, ::testing::Values(Transport::kGloo),
                         TransportParamName);
INSTANTIATE_TEST_SUITE_P(Nccl, PointToPointTest, ::testing::Values(Transport::kNccl),
                         TransportParamName);

}  // namespace
}  // namespace gradhub::ddp::pipeline
