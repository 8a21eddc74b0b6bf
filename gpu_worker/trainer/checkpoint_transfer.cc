#include "gpu_worker/trainer/checkpoint_transfer.h"

#include <torch/torch.h>

#include <algorithm>
#include <cstring>

#include "gpu_worker/ddp/pipeline/stage_autograd.h"

namespace gradhub::trainer {
namespace {

using ddp::pipeline::MessageKind;
using ddp::pipeline::MessageTag;

// kLoss goes from a replica's last stage to its stage 0 at boundary 0 only.
const uint32_t kLengthTag = MessageTag(MessageKind::kLoss, /*boundary=*/1, /*micro_batch=*/0);
const uint32_t kBytesTag = MessageTag(MessageKind::kLoss, /*boundary=*/2, /*micro_batch=*/0);

at::Tensor Padded(std::string_view bytes, int64_t size) {
  at::Tensor padded = torch::zeros({(size + 7) / 8}, at::kLong);
  std::memcpy(padded.data_ptr(), bytes.data(), bytes.size());
  return padded;
}

std::string BytesOf(const at::Tensor& cpu, int64_t size) {
  return std::string(static_cast<const char*>(cpu.data_ptr()), static_cast<size_t>(size));
}

}  // namespace

std::optional<std::string> BroadcastBytes(ddp::ProcessGroup& group,
                                          std::optional<std::string_view> bytes,
                                          const c10::Device& device) {
  at::Tensor length =
      torch::tensor({bytes ? static_cast<int64_t>(bytes->size()) : int64_t{-1}}).to(device);
  group.Broadcast({length}, 0)->Wait();
  const int64_t size = length.item<int64_t>();
  if (size < 0) return std::nullopt;
  at::Tensor payload = group.rank() == 0 ? Padded(*bytes, size) : Padded("", size);
  payload = payload.to(device);
  group.Broadcast({payload}, 0)->Wait();
  return BytesOf(payload.cpu(), size);
}

std::vector<std::string> AllGatherBytes(ddp::ProcessGroup& group, const std::string& bytes,
                                        const c10::Device& device) {
  const auto on_device = at::TensorOptions().dtype(at::kLong).device(device);
  std::vector<at::Tensor> lengths;
  for (int r = 0; r < group.size(); ++r) lengths.push_back(torch::empty({1}, on_device));
  group.AllGather(lengths, torch::tensor({static_cast<int64_t>(bytes.size())}).to(device))->Wait();
  int64_t longest = 1;
  for (at::Tensor& length : lengths) {
    length = length.cpu();
    longest = std::max(longest, length.item<int64_t>());
  }
  const at::Tensor mine = Padded(bytes, longest).to(device);
  std::vector<at::Tensor> all;
  for (int r = 0; r < group.size(); ++r) all.push_back(torch::empty_like(mine));
  group.AllGather(all, mine)->Wait();
  std::vector<std::string> result;
  for (int r = 0; r < group.size(); ++r) {
    result.push_back(BytesOf(all[r].cpu(), lengths[r].item<int64_t>()));
  }
  return result;
}

namespace {

// Int64 elements that hold `bytes`.
int64_t Elements(int64_t bytes) { return (bytes + 7) / 8; }

// Step 2's chunks: `visit(offset, size)` for each, in order.
template <typename Visit>
void ForEachChunk(int64_t length, Visit&& visit) {
  for (int64_t offset = 0; offset < length; offset += kTransferChunkBytes) {
    visit(offset, std::min(kTransferChunkBytes, length - offset));
  }
}

at::Tensor Staging(int64_t length, const c10::Device& device) {
  return torch::zeros({Elements(std::min(kTransferChunkBytes, length))},
                      at::TensorOptions().dtype(at::kLong).device(device));
}

}  // namespace

void SendBytes(ddp::ProcessGroup& group, std::string_view bytes, int to,
               const c10::Device& device) {
  const int64_t length = static_cast<int64_t>(bytes.size());
  group.Send(torch::tensor({length}).to(device), to, kLengthTag)->Wait();  // step 1
  at::Tensor staging = Staging(length, device);                            // step 2
  at::Tensor host = device.is_cpu() ? staging : torch::zeros_like(staging, at::kCPU);
  ForEachChunk(length, [&](int64_t offset, int64_t size) {
    std::memcpy(host.data_ptr(), bytes.data() + offset, static_cast<size_t>(size));
    at::Tensor chunk = staging.narrow(0, 0, Elements(size));
    if (!device.is_cpu()) chunk.copy_(host.narrow(0, 0, Elements(size)));
    group.Send(chunk, to, kBytesTag)->Wait();
  });
}

int64_t ReceiveBytes(ddp::ProcessGroup& group, int from, const c10::Device& device,
                     const std::function<void(std::string_view)>& consume) {
  at::Tensor received = torch::empty({1}, at::TensorOptions().dtype(at::kLong).device(device));
  group.Recv(received, from, kLengthTag)->Wait();  // step 1
  const int64_t length = received.cpu().item<int64_t>();
  at::Tensor staging = Staging(length, device);  // step 2
  ForEachChunk(length, [&](int64_t /*offset*/, int64_t size) {
    at::Tensor chunk = staging.narrow(0, 0, Elements(size));
    group.Recv(chunk, from, kBytesTag)->Wait();
    const at::Tensor host = chunk.cpu();
    consume(std::string_view(static_cast<const char*>(host.data_ptr()), static_cast<size_t>(size)));
  });
  return length;
}

}  // namespace gradhub::trainer
