#include "gpu_worker/ddp/comm/gloo/gloo_process_group.h"

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>
#include <netdb.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <utility>

#include "gpu_worker/ddp/comm/checks.h"
#include "gpu_worker/ddp/comm/collective_checks.h"
#include "gpu_worker/ddp/comm/gloo/gloo_failure.h"
#include "gpu_worker/ddp/comm/gloo/gloo_store_adapter.h"
#include "gpu_worker/ddp/comm/reduce_kernels.h"

namespace gradhub::ddp {
namespace {

using detail::StrCat;

// The machine's hostname when some address it resolves to can be bound here, which is what
// gloo's tcp::CreateDevice will try; otherwise loopback.
std::string BindableHostname() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "127.0.0.1";
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* result = nullptr;
  if (getaddrinfo(name, nullptr, &hints, &result) != 0 || result == nullptr) return "127.0.0.1";
  bool bindable = false;
  for (addrinfo* ai = result; ai != nullptr && !bindable; ai = ai->ai_next) {
    const int fd = socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
    if (fd < 0) continue;
    bindable = bind(fd, ai->ai_addr, ai->ai_addrlen) == 0;  // port 0: any free port
    close(fd);
  }
  freeaddrinfo(result);
  return bindable ? std::string(name) : std::string("127.0.0.1");
}

// Step 1 of the protocol: an explicit hostname is used as given (gloo reports what is wrong
// with it), then GLOO_SOCKET_IFNAME's interface, then BindableHostname.
gloo::transport::tcp::attr ListenAttributes(const std::string& requested) {
  gloo::transport::tcp::attr attr;
  const char* interface = std::getenv("GLOO_SOCKET_IFNAME");
  if (!requested.empty()) {
    attr.hostname = requested;
  } else if (interface != nullptr && interface[0] != '\0') {
    attr.iface = interface;
  } else {
    attr.hostname = BindableHostname();
  }
  return attr;
}

void GlooBroadcast(const std::shared_ptr<gloo::Context>& context, uint32_t tag,
                   std::chrono::milliseconds timeout, void* data, size_t bytes, int root) {
  gloo::BroadcastOptions opts(context);
  opts.setOutput(static_cast<uint8_t*>(data), bytes);
  opts.setRoot(root);
  opts.setTag(tag);
  opts.setTimeout(timeout);
  gloo::broadcast(opts);
}

// Broadcasts `tensors` from `root` in one transfer, `run(data)` of `total_bytes` bytes: a
// lone tensor in place, several (a model's parameters) through one buffer of their bytes back
// to back, instead of one round trip per tensor.
template <typename Run>
void BroadcastTensors(const std::vector<at::Tensor>& tensors, bool sending, size_t total_bytes,
                      Run&& run) {
  if (tensors.size() == 1) {
    run(tensors[0].data_ptr());
    return;
  }
  std::vector<uint8_t> flat(total_bytes);
  size_t offset = 0;
  for (const auto& t : tensors) {
    if (sending) std::memcpy(flat.data() + offset, t.data_ptr(), t.nbytes());
    offset += t.nbytes();
  }
  run(flat.data());
  if (sending) return;
  offset = 0;
  for (const auto& t : tensors) {
    std::memcpy(t.data_ptr(), flat.data() + offset, t.nbytes());
    offset += t.nbytes();
  }
}

// gloo gathers into one buffer: the outputs themselves when they are one (slices of a flat
// tensor), else a temporary copied out afterwards.
void GatherTensors(const std::shared_ptr<gloo::Context>& context, uint32_t tag,
                   std::chrono::milliseconds timeout, const std::vector<at::Tensor>& outputs,
                   const at::Tensor& input) {
  const size_t bytes = input.nbytes();
  const bool flat = detail::IsOneFlatBuffer(outputs, bytes);
  std::vector<uint8_t> temporary(flat ? 0 : bytes * outputs.size());
  uint8_t* gathered = flat ? static_cast<uint8_t*>(outputs[0].data_ptr()) : temporary.data();
  gloo::AllgatherOptions opts(context);
  opts.setInput(static_cast<uint8_t*>(input.data_ptr()), bytes);
  opts.setOutput(gathered, bytes * outputs.size());
  opts.setTag(tag);
  opts.setTimeout(timeout);
  gloo::allgather(opts);
  if (flat) return;
  for (size_t r = 0; r < outputs.size(); ++r) {
    std::memcpy(outputs[r].data_ptr(), gathered + r * bytes, bytes);
  }
}

}  // namespace

GlooProcessGroup::GlooProcessGroup(const ProcessGroupOptions& options)
    : ProcessGroup(options.rank, options.size, options.name),
      timeout_(options.timeout),
      who_(StrCat("process group '", options.name, "' rank ", options.rank, "/", options.size)) {
  ValidateProcessGroupOptions(options);
  const GlooOptions gloo = options.gloo.value_or(GlooOptions{});
  const gloo::transport::tcp::attr listen = ListenAttributes(gloo.hostname);
  listen_hostname_ = listen.hostname;
  listen_interface_ = listen.iface;
  hostname_ = listen.iface.empty() ? listen.hostname : "interface " + listen.iface;
  ConnectChannels(options, gloo);
  // Sealing before shared memory: rank 0's last write of the sealing agreement (the verdict)
  // is read by every other rank before it writes its shared-memory key, which rank 0 waits
  // for, so a store that rank 0 hosts (a TCPStore server, gone once its owner drops it after
  // this constructor) outlives every read of the agreement.
  const std::optional<TrafficKey> key = SetUpSealing(options, gloo);
  SetUpSharedMemory(options, gloo);
  GlooPointToPoint::Setup p2p{this, &health_, {}, key, timeout_};
  for (const auto& channel : channels_) p2p.contexts.push_back(channel->context);
  p2p_ = std::make_unique<GlooPointToPoint>(std::move(p2p));
  for (auto& channel : channels_) {
    Channel* raw = channel.get();
    raw->thread = std::thread([this, raw] { RunChannel(*raw); });
  }
}

void GlooProcessGroup::ConnectChannels(const ProcessGroupOptions& options,
                                       const GlooOptions& gloo) {
  for (int i = 0; i < gloo.channels; ++i) {
    auto channel = std::make_unique<Channel>();
    channel->index = i;
    const std::string prefix = StrCat(name(), "/channel-", i, "/");
    try {
      gloo::transport::tcp::attr attr;
      attr.hostname = listen_hostname_;
      attr.iface = listen_interface_;
      // A device per channel: each has its own event-loop thread, so the channels' transfers
      // do not queue behind one another in one loop.
      GRADHUB_GLOO_CHECK(channel->device = gloo::transport::tcp::CreateDevice(attr));
      channel->context = std::make_shared<gloo::rendezvous::Context>(rank(), size());
      channel->context->setTimeout(timeout_);
      GlooStoreAdapter adapter(options.store, prefix, timeout_);
      GRADHUB_GLOO_CHECK(channel->context->connectFullMesh(adapter, channel->device));
    } catch (const std::exception& e) {
      throw CommError(StrCat(who_, ": rendezvous of channel ", i, " (store keys '", prefix,
                             "*', listening on ", hostname_, ") failed: ", e.what()));
    }
    channels_.push_back(std::move(channel));
  }
}

void GlooProcessGroup::SetUpSharedMemory(const ProcessGroupOptions& options,
                                         const GlooOptions& gloo) {
  SharedMemorySetup::Options shm;
  shm.store = options.store;
  shm.prefix = name() + "/shm/";
  shm.rank = rank();
  shm.size = size();
  shm.segments = gloo.channels;
  shm.enabled = gloo.shared_memory;
  shm.directory = gloo.shared_memory_dir;
  shm.timeout = timeout_;
  SharedMemorySetup setup;
  try {
    setup = SharedMemorySetup::Establish(shm);
  } catch (const std::exception& e) {
    throw CommError(
        StrCat(who_, ": shared-memory setup (store keys '", shm.prefix, "*') failed: ", e.what()));
  }
  if (rank() == 0 && !setup.failure.empty()) {
    std::fprintf(stderr, "%s: shared-memory allreduce unavailable, using TCP: %s\n", who_.c_str(),
                 setup.failure.c_str());
  }
  for (size_t i = 0; i < setup.segments.size(); ++i) {
    channels_[i]->shared_memory = std::move(setup.segments[i]);
  }
  if (!setup.segments.empty()) {
    buffers_ = std::make_unique<SharedMemoryBuffers>(
        SharedMemoryBuffers::Options{options.store, name() + "/shm-buffers/", rank(), size(),
                                     gloo.shared_memory_dir, timeout_, who_});
  }
}

at::Tensor GlooProcessGroup::AllocateCollectiveBuffer(int64_t numel,
                                                      const at::TensorOptions& options) {
  if (buffers_ == nullptr) return ProcessGroup::AllocateCollectiveBuffer(numel, options);
  return buffers_->Allocate(numel, options);
}

std::optional<TrafficKey> GlooProcessGroup::SetUpSealing(const ProcessGroupOptions& options,
                                                         const GlooOptions& gloo) {
  const TrafficKeyAgreement::Options agreement{options.store, name() + "/sealing/", rank(),
                                               size(),        gloo.encrypt_traffic, timeout_};
  std::optional<TrafficKey> key;
  try {
    key = TrafficKeyAgreement::Establish(agreement);
  } catch (const std::exception& e) {
    throw CommError(StrCat(who_, ": agreeing on traffic encryption (store keys '", agreement.prefix,
                           "*') failed: ", e.what()));
  }
  if (!key) return std::nullopt;
  for (auto& channel : channels_) {
    channel->sealed =
        std::make_unique<SealedChannel>(channel->context, *key, name(), channel->index);
  }
  return key;
}

GlooProcessGroup::~GlooProcessGroup() {
  p2p_.reset();  // waits for the transfers in flight, each bounded by its deadline
  for (auto& channel : channels_) {
    {
      std::lock_guard<std::mutex> lock(channel->mu);
      channel->stopping = true;
    }
    channel->wake.notify_all();
  }
  for (auto& channel : channels_) {
    if (channel->thread.joinable()) channel->thread.join();
  }
  // Contexts close their pairs, then the devices stop their loops (member order).
}

std::shared_ptr<Work> GlooProcessGroup::Submit(const char* kind, const std::string& detail,
                                               bool empty, bool after_prior, RunFn run) {
  std::lock_guard<std::mutex> lock(issue_mu_);
  const uint64_t seq = next_seq_++;
  auto work =
      std::make_shared<Work>(detail::DescribeCollective(*this, kind, seq, detail), timeout_);
  if (health_.broken()) {
    work->Complete(health_.UnusableError(work->description(), name()));
    return work;
  }
  if (empty) {
    work->Complete();
    return work;
  }
  in_flight_.erase(std::remove_if(in_flight_.begin(), in_flight_.end(),
                                  [](const std::shared_ptr<Work>& w) { return w->IsCompleted(); }),
                   in_flight_.end());

  auto op = std::make_unique<Op>();
  if (after_prior) op->prior = in_flight_;
  in_flight_.push_back(work);
  op->seq = seq;
  op->work = work;
  op->run = std::move(run);
  Channel& channel = *channels_[seq % channels_.size()];
  {
    std::lock_guard<std::mutex> channel_lock(channel.mu);
    channel.queue.push_back(std::move(op));
  }
  channel.wake.notify_one();
  return work;
}

void GlooProcessGroup::RunChannel(Channel& channel) {
  const std::string thread_name = StrCat("gloo-", channel.index).substr(0, 15);
  pthread_setname_np(pthread_self(), thread_name.c_str());
  for (;;) {
    std::unique_ptr<Op> op;
    {
      std::unique_lock<std::mutex> lock(channel.mu);
      channel.wake.wait(lock, [&] { return channel.stopping || !channel.queue.empty(); });
      if (channel.queue.empty()) return;  // stopping and drained
      op = std::move(channel.queue.front());
      channel.queue.pop_front();
    }
    // Ops only reach the queue while the context exists, and it outlives this thread.
    if (health_.broken()) {
      op->work->Complete(health_.UnusableError(op->work->description(), name()));
      continue;
    }
    op->work->MarkStarted();
    try {
      WaitForPrior(*op);
      op->run(channel, op->seq);
      op->work->Complete();
    } catch (...) {
      const std::string message =
          op->work->description() + ": " + GlooFailureReason(std::current_exception(), timeout_);
      health_.MarkBroken(message);
      op->work->Complete(std::make_exception_ptr(CommError(message)));
    }
  }
}

void GlooProcessGroup::WaitForPrior(const Op& op) const {
  // Protocol step 6. These ops were issued earlier, so they sit ahead of this one in their
  // channels' queues and never wait for it: no cycle. A failed one has broken the group, and
  // this op then fails as well.
  const auto deadline = Work::Clock::now() + timeout_;
  for (const auto& work : op.prior) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Work::Clock::now());
    try {
      work->Wait(std::max(left, std::chrono::milliseconds(1)));
    } catch (const std::exception& e) {
      if (!work->IsCompleted()) {
        throw CommError(StrCat("timed out after ", timeout_.count(), " ms waiting for earlier ",
                               work->description()));
      }
      throw CommError(StrCat("earlier collective failed: ", e.what()));
    }
  }
}

std::shared_ptr<Work> GlooProcessGroup::Broadcast(std::vector<at::Tensor> tensors, int root) {
  const detail::CheckedCollective checked =
      detail::CheckBroadcast(*this, c10::Device(c10::kCPU), tensors, root);
  size_t total_bytes = 0;
  for (const auto& t : tensors) total_bytes += t.nbytes();
  const auto timeout = timeout_;
  return Submit(
      "broadcast", checked.detail, checked.empty, /*after_prior=*/false,
      [tensors = std::move(tensors), root, total_bytes, timeout](Channel& channel, uint64_t seq) {
        const bool sending = channel.context->rank == root;
        BroadcastTensors(tensors, sending, total_bytes, [&](void* data) {
          if (channel.sealed != nullptr) {
            channel.sealed->Broadcast(data, total_bytes, root, seq, timeout);
          } else {
            GlooBroadcast(channel.context, static_cast<uint32_t>(seq), timeout, data, total_bytes,
                          root);
          }
        });
      });
}

std::shared_ptr<Work> GlooProcessGroup::AllReduce(at::Tensor tensor, ReduceOp op) {
  const detail::CheckedCollective checked =
      detail::CheckAllReduce(*this, c10::Device(c10::kCPU), tensor, op);
  const detail::ReduceKernel kernel = detail::KernelFor(tensor.scalar_type(), op, size());
  // Every rank finds its tensor in a shared buffer or none: they allocated alike.
  std::optional<SharedMemoryBuffers::Copies> copies;
  if (buffers_ != nullptr && !checked.empty) {
    copies = buffers_->Find(tensor.data_ptr(), tensor.nbytes());
  }
  // `this` outlives the op: the destructor joins the channel threads.
  return Submit("allreduce", checked.detail, checked.empty, /*after_prior=*/false,
                [this, tensor = std::move(tensor), copies, kernel](Channel& channel, uint64_t seq) {
                  RunAllReduce(channel, seq, tensor, copies, kernel);
                });
}

void GlooProcessGroup::RunAllReduce(Channel& channel, uint64_t seq, const at::Tensor& tensor,
                                    const std::optional<SharedMemoryBuffers::Copies>& copies,
                                    const detail::ReduceKernel& kernel) {
  void* data = tensor.data_ptr();
  const size_t n = static_cast<size_t>(tensor.numel());
  if (copies) {
    channel.shared_memory->AllReduceInPlace(copies->ranks, n, kernel, timeout_);
    return;
  }
  if (channel.shared_memory != nullptr) {
    channel.shared_memory->AllReduce(data, n, kernel, timeout_);
    return;
  }
  if (channel.sealed != nullptr) {
    channel.sealed->AllReduce(data, n, kernel, seq, timeout_);
    return;
  }
  // gloo takes typed buffers.
  detail::VisitSupportedDtype(tensor.scalar_type(), [&](auto type_tag) {
    using T = decltype(type_tag);
    gloo::AllreduceOptions opts(channel.context);
    opts.setOutput(static_cast<T*>(data), n);  // in place: output doubles as input
    opts.setReduceFunction(kernel.reduce);
    opts.setTag(static_cast<uint32_t>(seq));
    opts.setTimeout(timeout_);
    gloo::allreduce(opts);
  });
  if (kernel.divide != nullptr) kernel.divide(data, n, size());
}

std::shared_ptr<Work> GlooProcessGroup::AllGather(std::vector<at::Tensor> outputs,
                                                  at::Tensor input) {
  const detail::CheckedCollective checked =
      detail::CheckAllGather(*this, c10::Device(c10::kCPU), outputs, input);
  const auto timeout = timeout_;
  return Submit(
      "allgather", checked.detail, checked.empty, /*after_prior=*/false,
      [outputs = std::move(outputs), input = std::move(input), timeout](Channel& channel,
                                                                        uint64_t seq) {
        if (channel.sealed != nullptr) {
          std::vector<void*> blocks;
          for (const auto& output : outputs) blocks.push_back(output.data_ptr());
          channel.sealed->AllGather(input.data_ptr(), input.nbytes(), blocks, seq, timeout);
          return;
        }
        GatherTensors(channel.context, static_cast<uint32_t>(seq), timeout, outputs, input);
      });
}

std::shared_ptr<Work> GlooProcessGroup::Barrier() {
  const auto timeout = timeout_;
  return Submit("barrier", "", false, /*after_prior=*/true,
                [timeout](Channel& channel, uint64_t seq) {
                  gloo::BarrierOptions opts(channel.context);
                  opts.setTag(static_cast<uint32_t>(seq));
                  opts.setTimeout(timeout);
                  gloo::barrier(opts);
                });
}

std::shared_ptr<Work> GlooProcessGroup::Send(at::Tensor tensor, int dst, uint32_t tag) {
  return p2p_->Send(std::move(tensor), dst, tag);
}

std::shared_ptr<Work> GlooProcessGroup::Recv(at::Tensor tensor, int src, uint32_t tag) {
  return p2p_->Recv(std::move(tensor), src, tag);
}

}  // namespace gradhub::ddp
