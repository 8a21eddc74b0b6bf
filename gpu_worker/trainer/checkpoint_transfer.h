// Moving a checkpoint's bytes between ranks through their process group, which moves typed
// tensors only: bytes go as int64 elements (padded to whole ones), after their length. They
// travel on `device` (an NCCL group moves only tensors on its GPU) and are read back on the
// CPU. Every function is a collective of the ranks it names, which must call it alike.
// Not thread-safe: the training thread calls them, between steps.
#pragma once

#include <c10/core/Device.h>

#include <optional>
#include <string>
#include <vector>

#include "gpu_worker/ddp/comm/process_group.h"

namespace gradhub::trainer {

// Sends `bytes` from rank 0 to every rank (the others pass nullopt and get rank 0's value).
// nullopt everywhere when rank 0 has none.
std::optional<std::string> BroadcastBytes(ddp::ProcessGroup& group,
                                          std::optional<std::string> bytes,
                                          const c10::Device& device);

// Every rank's `bytes`, in rank order, on every rank.
std::vector<std::string> AllGatherBytes(ddp::ProcessGroup& group, const std::string& bytes,
                                        const c10::Device& device);

// Point to point, between two ranks only: SendBytes on `from`'s side, ReceiveBytes naming
// `from` on the other, each returning once the transfer completed. Between one pair,
// transfers match in the order they were made. Their tags are the pipeline's kLoss kind at
// boundaries the pipeline's loss never uses (stage_autograd.h), and they run between steps,
// so they never meet a step's messages.
void SendBytes(ddp::ProcessGroup& group, const std::string& bytes, int to,
               const c10::Device& device);
std::string ReceiveBytes(ddp::ProcessGroup& group, int from, const c10::Device& device);

}  // namespace gradhub::trainer
