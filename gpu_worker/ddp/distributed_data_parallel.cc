#include "gpu_worker/ddp/distributed_data_parallel.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <map>
#include <sstream>
#include <stdexcept>

namespace gradhub::ddp {
namespace {

using Clock = std::chrono::steady_clock;

// A parameter's signature for the cross-rank check: ndim, dims..., dtype.
std::vector<int64_t> Signature(const std::vector<at::Tensor>& parameters) {
  std::vector<int64_t> signature;
  for (const at::Tensor& parameter : parameters) {
    signature.push_back(parameter.dim());
    for (int64_t size : parameter.sizes()) signature.push_back(size);
    signature.push_back(static_cast<int64_t>(parameter.scalar_type()));
  }
  return signature;
}

std::string Describe(const int64_t* signature, size_t* position) {
  std::ostringstream text;
  const int64_t dims = signature[(*position)++];
  text << "[";
  for (int64_t d = 0; d < dims; ++d) text << (d ? ", " : "") << signature[(*position)++];
  text << "] " << c10::toString(static_cast<at::ScalarType>(signature[(*position)++]));
  return text.str();
}

// Every rank's vector, padded with -1 to the longest. The tensors travel on `device`, the
// parameters' (an NCCL group moves only tensors on its GPU), and are read back on the CPU.
std::vector<std::vector<int64_t>> AllGather(ProcessGroup& group, std::vector<int64_t> values,
                                            const c10::Device& device) {
  const auto options = at::TensorOptions().dtype(at::kLong).device(device);
  at::Tensor length = at::tensor({static_cast<int64_t>(values.size())}, at::kLong).to(device);
  std::vector<at::Tensor> lengths;
  for (int r = 0; r < group.size(); ++r) lengths.push_back(at::empty({1}, options));
  group.AllGather(lengths, length)->Wait();
  int64_t longest = 0;
  for (auto& l : lengths) {
    l = l.cpu();
    longest = std::max(longest, l.item<int64_t>());
  }
  values.resize(longest, -1);
  std::vector<at::Tensor> gathered;
  for (int r = 0; r < group.size(); ++r) gathered.push_back(at::empty({longest}, options));
  group.AllGather(gathered, at::tensor(values, at::kLong).to(device))->Wait();
  std::vector<std::vector<int64_t>> result;
  for (int r = 0; r < group.size(); ++r) {
    gathered[r] = gathered[r].cpu();
    const int64_t* data = gathered[r].data_ptr<int64_t>();
    result.emplace_back(data, data + longest);
    result.back().resize(lengths[r].item<int64_t>());
  }
  return result;
}

}  // namespace

void VerifySameParameters(ProcessGroup& group, const std::vector<std::string>& names,
                          const std::vector<at::Tensor>& parameters) {
  std::vector<int64_t> mine = Signature(parameters);
  mine.insert(mine.begin(), static_cast<int64_t>(parameters.size()));
  const auto all =
      AllGather(group, mine, parameters.empty() ? c10::Device(c10::kCPU) : parameters[0].device());
  const std::vector<int64_t>& reference = all[0];
  for (int r = 1; r < group.size(); ++r) {
    const std::vector<int64_t>& theirs = all[r];
    if (theirs[0] != reference[0]) {
      throw std::invalid_argument("DistributedDataParallel: rank " + std::to_string(r) + " has " +
                                  std::to_string(theirs[0]) + " parameters, rank 0 has " +
                                  std::to_string(reference[0]));
    }
    size_t a = 1, b = 1;
    for (int64_t p = 0; p < reference[0]; ++p) {
      const std::string want = Describe(reference.data(), &a);
      const std::string got = Describe(theirs.data(), &b);
      if (want != got) {
        const std::string name = p < static_cast<int64_t>(names.size()) ? names[p] : "?";
        throw std::invalid_argument("DistributedDataParallel: parameter " + std::to_string(p) +
                                    " (" + name + ") is " + want + " on rank 0 but " + got +
                                    " on rank " + std::to_string(r));
      }
    }
  }
}

void BroadcastCoalesced(ProcessGroup& group, const std::vector<at::Tensor>& tensors, int root) {
  if (group.size() == 1 || tensors.empty()) return;
  // One collective per dtype instead of one per tensor.
  std::map<at::ScalarType, std::vector<at::Tensor>> by_type;
  for (const at::Tensor& tensor : tensors) by_type[tensor.scalar_type()].push_back(tensor);
  c10::NoGradGuard no_grad;
  for (auto& [type, same_type] : by_type) {
    std::vector<at::Tensor> flat_parts;
    for (const at::Tensor& tensor : same_type) flat_parts.push_back(tensor.reshape({-1}));
    at::Tensor flat = at::cat(flat_parts);
    group.Broadcast({flat}, root)->Wait();
    int64_t offset = 0;
    for (const at::Tensor& tensor : same_type) {
      const_cast<at::Tensor&>(tensor).copy_(
          flat.narrow(0, offset, tensor.numel()).view(tensor.sizes()));
      offset += tensor.numel();
    }
  }
}

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<torch::nn::Module> module,
                                                 std::shared_ptr<ProcessGroup> group,
                                                 DdpOptions options)
    : module_(std::move(module)), group_(std::move(group)), options_(options) {
  std::vector<at::Tensor> parameters;
  std::vector<std::string> names;
  for (const auto& item : module_->named_parameters(/*recurse=*/true)) {
    if (!item.value().requires_grad()) continue;
    names.push_back(item.key());
    parameters.push_back(item.value());
  }
  for (const auto& item : module_->named_buffers(/*recurse=*/true))
    buffers_.push_back(item.value());

  VerifySameParameters(*group_, names, parameters);
  BroadcastCoalesced(*group_, parameters, 0);
  BroadcastCoalesced(*group_, buffers_, 0);
  reducer_ = std::make_unique<Reducer>(parameters, names, group_, options_.reducer);
}

DistributedDataParallel::~DistributedDataParallel() = default;

at::Tensor DistributedDataParallel::Forward(const std::function<at::Tensor()>& forward) {
  if (armed_) {
    throw std::logic_error(
        "DistributedDataParallel: Forward() again before Backward() of the last synchronized "
        "forward");
  }
  const auto start = Clock::now();
  if (options_.broadcast_buffers) BroadcastCoalesced(*group_, buffers_, 0);
  at::Tensor output = forward();
  timings_.forward = Clock::now() - start;
  if (sync_ && c10::GradMode::is_enabled() && output.requires_grad()) {
    reducer_->Prepare({output});
    armed_ = true;
  }
  return output;
}

void DistributedDataParallel::Backward(const at::Tensor& loss) {
  const auto start = Clock::now();
  loss.backward();
  timings_.allreduce_wait = std::chrono::nanoseconds(0);
  if (armed_) {
    armed_ = false;
    reducer_->Finalize();
    timings_.allreduce_wait = reducer_->last_stats().wait;
  }
  timings_.backward = Clock::now() - start - timings_.allreduce_wait;
}

void DistributedDataParallel::ZeroGrad() { reducer_->ZeroGrad(); }

}  // namespace gradhub::ddp
