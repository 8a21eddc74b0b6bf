// Moving a checkpoint's bytes between ranks through their process group, which moves typed
// tensors only: bytes go as int64 elements (padded to whole ones), after their length. They
// travel on `device` (an NCCL group moves only tensors on its GPU) and are read back on the
// CPU. Every function is a collective of the ranks it names, which must call it alike.
// Not thread-safe: the training thread calls them, between steps.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gpu_worker/ddp/comm/process_group.h"

namespace gradhub::trainer {

// Sends `bytes` from rank 0 to every rank (the others pass nullopt and get rank 0's value).
// nullopt everywhere when rank 0 has none.
std::optional<std::string> BroadcastBytes(ddp::ProcessGroup& group,
                                          std::optional<std::string_view> bytes,
                                          const c10::Device& device);

// Every rank's `bytes`, in rank order, on every rank.
std::vector<std::string> AllGatherBytes(ddp::ProcessGroup& group, const std::string& bytes,
                                        const c10::Device& device);

// Point to point, between two ranks only: SendBytes on `from`'s side, ReceiveBytes naming
// `from` on the other, each returning once its part of the transfer completed. Between one pair,
// transfers match in the order they were made. A transfer streams, for bytes as large as a pipeline
// stage's state, of which neither side may hold a second copy in memory (checkpoint_bytes.h):
//   1. the sender sends the length, one int64;
//   2. then the bytes in chunks of kTransferChunkBytes (the last one shorter), each padded to
//      whole int64s, through one staging tensor on `device`. Both sides derive every chunk's
//      size from the length, so each receive is exactly its message's size (Gloo aborts the
//      process on a message larger than the receive posted for it).
// Their tags are the pipeline's kLoss kind at boundaries the pipeline's loss never uses
// (stage_autograd.h), and they run between steps, so they never meet a step's messages.
inline constexpr int64_t kTransferChunkBytes = int64_t{4} << 20;
void SendBytes(ddp::ProcessGroup& group, std::string_view bytes, int to, const c10::Device& device);
// Hands the bytes to `consume` chunk by chunk, in order (each view is valid during its call
// only), and returns their length.
int64_t ReceiveBytes(ddp::ProcessGroup& group, int from, const c10::Device& device,
                     const std::function<void(std::string_view)>& consume);

}  // namespace gradhub::trainer
