// The GPU check (tests/gpu/run.sh): NCCL process group collectives at world size 1 on cuda:0,
// then a short DDP training on cuda:0, timed, then the same training in mixed precision:
// BF16 autocast, and FP16 autocast with dynamic loss scaling (one step poisoned with inf must
// be skipped and back the scale off). No gtest: a GPU node has only PyTorch.
// Prints "check <name> ok|FAIL <detail>" lines and "step_ms <value>"; exits 0 when all pass,
// 77 when no GPU is visible, 1 otherwise.
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "gpu_worker/ddp/distributed_data_parallel.h"
#include "gpu_worker/ddp/mixed_precision.h"
#include "gpu_worker/ddp/store/in_memory_store.h"
#include "gpu_worker/devices/devices.h"

namespace {

using namespace gradhub;

int failures = 0;

void Check(const std::string& name, bool ok, const std::string& detail = "") {
  std::printf("check %-28s %s %s\n", name.c_str(), ok ? "ok" : "FAIL", detail.c_str());
  failures += ok ? 0 : 1;
}

struct Mlp : torch::nn::Module {
  Mlp()
      : fc0(register_module("fc0", torch::nn::Linear(784, 1024))),
        fc1(register_module("fc1", torch::nn::Linear(1024, 1024))),
        fc2(register_module("fc2", torch::nn::Linear(1024, 10))) {}
  torch::Tensor forward(torch::Tensor x) { return fc2(torch::relu(fc1(torch::relu(fc0(x))))); }
  torch::nn::Linear fc0, fc1, fc2;
};

// 200 DDP steps of the MLP on cuda:0 under autocast to `dtype`; with FP16 through a
// LossScaler, and step 100's loss multiplied by inf so that step must be skipped.
void CheckMixedPrecision(std::shared_ptr<ddp::ProcessGroup> group, at::ScalarType dtype) {
  const std::string name = dtype == at::kHalf ? "fp16" : "bf16";
  const auto cuda = torch::TensorOptions().device(torch::kCUDA, 0);
  torch::manual_seed(0);
  auto model = std::make_shared<Mlp>();
  model->to(torch::Device(torch::kCUDA, 0));
  ddp::DistributedDataParallel ddp(model, group);
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  ddp::LossScaler scaler;
  at::Tensor x = torch::randn({64, 784}, cuda);
  at::Tensor y = torch::randint(10, {64}, cuda.dtype(torch::kLong));
  double first_loss = 0, last_loss = 0, scale_before = 0;
  for (int step = 0; step < 200; ++step) {
    ddp.ZeroGrad();
    at::Tensor loss = ddp.Forward([&] {
      ddp::AutocastGuard autocast(c10::DeviceType::CUDA, dtype);
      return torch::cross_entropy_loss(model->forward(x), y);
    });
    if (dtype != at::kHalf) {
      ddp.Backward(loss);
      optimizer.step();
    } else {
      at::Tensor scaled = scaler.Scale(loss);
      if (step == 100) {
        scale_before = scaler.scale();
        scaled = scaled * std::numeric_limits<float>::infinity();
      }
      ddp.Backward(scaled);
      const bool found_inf = scaler.Unscale(model->parameters());
      if (!found_inf) optimizer.step();
      scaler.Update(found_inf);
    }
    last_loss = loss.item<double>();
    if (step == 0) first_loss = last_loss;
  }
  Check("ddp " + name + " loss falls", last_loss < first_loss * 0.5,
        std::to_string(first_loss) + " -> " + std::to_string(last_loss));
  if (dtype == at::kHalf) {
    Check("fp16 poisoned step skipped", scaler.skipped_steps() >= 1 && scale_before > 0,
          std::to_string(scaler.skipped_steps()) + " skipped, scale " +
              std::to_string(scale_before) + " -> " + std::to_string(scaler.scale()));
  }
}

}  // namespace

int main() {
  devices::DeviceInventory inventory = devices::DiscoverDevices();
  if (inventory.gpus.empty()) {
    std::printf("no GPU: %s\n", inventory.gpu_unavailable_reason.c_str());
    return 77;
  }
  std::printf("gpu %s, NCCL %d\n", inventory.gpus[0].name.c_str(), inventory.nccl_version);
  ddp::ProcessGroupOptions options;
  options.backend = ddp::Backend::kNccl;
  options.store = std::make_shared<ddp::InMemoryStore>();
  options.nccl = ddp::NcclOptions{0};
  std::shared_ptr<ddp::ProcessGroup> group;
  try {
    group = ddp::CreateProcessGroup(options);
  } catch (const std::exception& error) {
    Check("nccl group", false, error.what());
    return 1;
  }
  const auto cuda = torch::TensorOptions().device(torch::kCUDA, 0);
  try {
    at::Tensor x = torch::arange(1000, cuda.dtype(torch::kFloat));
    group->AllReduce(x, ddp::ReduceOp::kSum)->Wait();
    Check("allreduce sum", torch::equal(x.cpu(), torch::arange(1000, torch::kFloat)));
    group->AllReduce(x, ddp::ReduceOp::kAverage)->Wait();
    Check("allreduce average", torch::equal(x.cpu(), torch::arange(1000, torch::kFloat)));
    at::Tensor half = torch::ones({77}, cuda.dtype(torch::kHalf));
    group->AllReduce(half)->Wait();
    Check("allreduce fp16", half.cpu().eq(1).all().item<bool>());
    at::Tensor b = torch::full({5}, 3.0, cuda);
    group->Broadcast({b}, 0)->Wait();
    Check("broadcast", b.cpu().eq(3).all().item<bool>());
    std::vector<at::Tensor> gathered = {torch::empty({4}, cuda)};
    group->AllGather(gathered, torch::full({4}, 7.0, cuda))->Wait();
    Check("allgather", gathered[0].cpu().eq(7).all().item<bool>());
    group->Barrier()->Wait();
    Check("barrier", true);

    at::Tensor big = torch::ones({25 << 20}, cuda);  // 100 MiB
    group->AllReduce(big)->Wait();
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < 10; ++i) group->AllReduce(big)->Wait();
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / 10;
    Check("allreduce 100 MiB", true, std::to_string(100.0 / 1024 / seconds) + " GiB/s algbw");
  } catch (const std::exception& error) {
    Check("collectives", false, error.what());
  }

  try {
    torch::manual_seed(0);
    auto model = std::make_shared<Mlp>();
    model->to(torch::Device(torch::kCUDA, 0));
    ddp::DistributedDataParallel ddp(model, group);
    torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
    at::Tensor x = torch::randn({64, 784}, cuda);
    at::Tensor y = torch::randint(10, {64}, cuda.dtype(torch::kLong));
    std::vector<double> times;
    double first_loss = 0, last_loss = 0;
    for (int step = 0; step < 200; ++step) {
      const auto start = std::chrono::steady_clock::now();
      ddp.ZeroGrad();
      at::Tensor loss =
          ddp.Forward([&] { return torch::cross_entropy_loss(model->forward(x), y); });
      ddp.Backward(loss);
      optimizer.step();
      last_loss = loss.item<double>();  // synchronizes with the device
      if (step == 0) first_loss = last_loss;
      times.push_back(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    Check("ddp loss falls on cuda:0", last_loss < first_loss * 0.5,
          std::to_string(first_loss) + " -> " + std::to_string(last_loss));
    std::sort(times.begin() + 50, times.end());
    std::printf("step_ms %.4f\n", 1000 * times[50 + (times.size() - 50) / 2]);
  } catch (const std::exception& error) {
    Check("ddp on cuda:0", false, error.what());
  }
  for (at::ScalarType dtype : {at::kBFloat16, at::kHalf}) {
    try {
      CheckMixedPrecision(group, dtype);
    } catch (const std::exception& error) {
      Check(std::string("ddp ") + c10::toString(dtype), false, error.what());
    }
  }
  return failures == 0 ? 0 : 1;
}
