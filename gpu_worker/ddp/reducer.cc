#include "gpu_worker/ddp/reducer.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <stdexcept>

namespace gradhub::ddp {

struct Reducer::Bucket {
  std::vector<size_t> parameters;  // indices, in the order they sit in the buffer
  at::Tensor buffer;               // flat gradients; .grad of each parameter is a view into it
  size_t pending = 0;              // parameters not ready yet in this step
  at::Tensor compressed;           // the fp16/bf16 copy in flight, with a comm hook
  std::shared_ptr<PowerSgd::Pending> powersgd;  // PowerSGD's first round in flight
  std::shared_ptr<Work> work;
};

namespace {

at::ScalarType CompressedType(CommHook hook) {
  return hook == CommHook::kFp16 ? at::kHalf : at::kBFloat16;
}

}  // namespace

Reducer::Reducer(std::vector<at::Tensor> parameters, std::vector<std::string> names,
                 std::shared_ptr<ProcessGroup> group, ReducerOptions options)
    : parameters_(std::move(parameters)),
      names_(std::move(names)),
      group_(std::move(group)),
      options_(options),
      ready_(parameters_.size(), false) {
  if (names_.size() != parameters_.size()) {
    throw std::invalid_argument("Reducer: one name per parameter is required");
  }
  std::vector<size_t> reverse_order(parameters_.size());
  std::iota(reverse_order.rbegin(), reverse_order.rend(), 0);
  BuildBuckets(reverse_order);
  if (options_.comm_hook == CommHook::kPowerSgd) {
    powersgd_ = std::make_unique<PowerSgd>(parameters_, group_, options_.powersgd);
  }
  hooks_ = std::make_unique<GradientReadyHooks>(parameters_,
                                                [this](size_t index) { OnGradientReady(index); });
}

Reducer::~Reducer() = default;

void Reducer::BuildBuckets(const std::vector<size_t>& order) {
  // Buckets close when full; a dtype change does not close the open bucket of another dtype,
  // as in PyTorch (compute_bucket_assignment_by_size).
  std::vector<std::unique_ptr<Bucket>> buckets;
  std::map<at::ScalarType, std::unique_ptr<Bucket>> open;
  std::map<at::ScalarType, int64_t> open_bytes;
  auto close = [&](at::ScalarType type) {
    buckets.push_back(std::move(open[type]));
    open.erase(type);
    open_bytes.erase(type);
  };
  for (size_t index : order) {
    const at::Tensor& parameter = parameters_[index];
    const at::ScalarType type = parameter.scalar_type();
    if (!open[type]) open[type] = std::make_unique<Bucket>();
    open[type]->parameters.push_back(index);
    open_bytes[type] += parameter.numel() * parameter.element_size();
    const int64_t cap = buckets.empty() ? options_.first_bucket_bytes : options_.bucket_cap_bytes;
    if (open_bytes[type] >= cap) close(type);
  }
  while (!open.empty()) close(open.begin()->first);
  // Launch order follows the position of each bucket's first parameter in `order`.
  std::vector<size_t> position(parameters_.size());
  for (size_t i = 0; i < order.size(); ++i) position[order[i]] = i;
  std::stable_sort(buckets.begin(), buckets.end(), [&](const auto& a, const auto& b) {
    return position[a->parameters.front()] < position[b->parameters.front()];
  });

  std::vector<Slot> slots(parameters_.size());
  for (size_t b = 0; b < buckets.size(); ++b) {
    Bucket& bucket = *buckets[b];
    int64_t elements = 0;
    for (size_t index : bucket.parameters) {
      slots[index] = {b, elements};
      elements += parameters_[index].numel();
    }
    const at::Tensor& first = parameters_[bucket.parameters.front()];
    bucket.buffer = at::zeros({elements}, first.options().requires_grad(false));
  }
  buckets_ = std::move(buckets);
  slots_ = std::move(slots);
  // Carry gradients accumulated so far (a rebuild may come in the middle of no_sync), then
  // make every .grad a view into its new bucket.
  for (size_t index = 0; index < parameters_.size(); ++index) {
    at::Tensor& parameter = parameters_[index];
    at::Tensor view = GradientView(index);
    if (parameter.grad().defined()) view.copy_(parameter.grad());
    parameter.mutable_grad() = view;
  }
}

at::Tensor Reducer::GradientView(size_t index) const {
  const Slot& slot = slots_[index];
  const at::Tensor& parameter = parameters_[index];
  return buckets_[slot.bucket]
      ->buffer.narrow(0, slot.offset, parameter.numel())
      .view(parameter.sizes());
}

void Reducer::LinkGradient(size_t index) {
  at::Tensor& parameter = parameters_[index];
  const at::Tensor& grad = parameter.grad();
  // Checked by address, without building a view: this runs for every parameter twice a step.
  const Slot& slot = slots_[index];
  const at::Tensor& buffer = buckets_[slot.bucket]->buffer;
  const void* expected =
      static_cast<const char*>(buffer.data_ptr()) + slot.offset * buffer.element_size();
  if (grad.defined() && grad.data_ptr() == expected && grad.sizes() == parameter.sizes()) return;
  // An optimizer that sets grads to None, or a user who replaced .grad, broke the link: the
  // view starts from zero, as a fresh .grad would.
  at::Tensor view = GradientView(index);
  view.zero_();
  parameter.mutable_grad() = view;
}

std::vector<std::vector<size_t>> Reducer::bucket_assignment() const {
  std::vector<std::vector<size_t>> assignment;
  for (const auto& bucket : buckets_) assignment.push_back(bucket->parameters);
  return assignment;
}

void Reducer::ZeroGrad() {
  for (size_t index = 0; index < parameters_.size(); ++index) LinkGradient(index);
  for (auto& bucket : buckets_) bucket->buffer.zero_();
}

void Reducer::RebuildBucketsFromRank0() {
  // Every rank must use the same assignment, so rank 0's observed order wins.
  std::vector<int64_t> order(parameters_.size(), -1);
  if (ready_order_.size() == parameters_.size()) {
    std::copy(ready_order_.begin(), ready_order_.end(), order.begin());
  }
  // On the parameters' device: an NCCL group moves only tensors on its GPU.
  const c10::Device device = parameters_.empty() ? c10::Device(c10::kCPU) : parameters_[0].device();
  at::Tensor shared = at::tensor(order, at::kLong).to(device);
  group_->Broadcast({shared}, 0)->Wait();
  shared = shared.cpu();
  if (shared[0].item<int64_t>() < 0) return;  // rank 0 saw an incomplete step: keep buckets
  std::vector<size_t> agreed(parameters_.size());
  const int64_t* data = shared.data_ptr<int64_t>();
  for (size_t i = 0; i < agreed.size(); ++i) agreed[i] = static_cast<size_t>(data[i]);
  BuildBuckets(agreed);
}

void Reducer::Prepare(const std::vector<at::Tensor>& outputs) {
  if (armed_) {
    throw std::logic_error(
        "Reducer: the previous step's gradients were never finalized; call Finalize() after "
        "every synchronized backward");
  }
  if (!rebuilt_ && stats_.buckets > 0) {
    RebuildBucketsFromRank0();
    rebuilt_ = true;
  }
  for (size_t index = 0; index < parameters_.size(); ++index) LinkGradient(index);
  std::fill(ready_.begin(), ready_.end(), false);
  for (auto& bucket : buckets_) {
    bucket->pending = bucket->parameters.size();
    bucket->work.reset();
    bucket->powersgd.reset();
  }
  next_bucket_ = 0;
  stats_ = ReductionStats();
  stats_.bucket_start_times.assign(buckets_.size(), {});
  armed_ = true;
  if (options_.find_unused_parameters) {
    for (size_t index : hooks_->Unreachable(outputs)) OnGradientReady(index);
  }
}

void Reducer::OnGradientReady(size_t index) {
  if (!armed_) return;  // a no_sync step, or a backward outside the DDP step
  if (ready_[index]) {
    throw std::logic_error("Reducer: gradient of " + names_[index] +
                           " became ready twice in one step (backward run twice without "
                           "no_sync?)");
  }
  ready_[index] = true;
  if (!rebuilt_) ready_order_.push_back(index);
  stats_.last_gradient_time = ReductionStats::Clock::now();
  if (--buckets_[slots_[index].bucket]->pending == 0) LaunchReadyBuckets();
}

void Reducer::LaunchReadyBuckets() {
  while (next_bucket_ < buckets_.size() && buckets_[next_bucket_]->pending == 0) {
    Bucket& bucket = *buckets_[next_bucket_++];
    if (group_->size() == 1) continue;  // alone, the local gradient is the average
    if (powersgd_ && powersgd_->active()) {
      std::vector<at::Tensor> grads;
      for (size_t index : bucket.parameters) grads.push_back(GradientView(index));
      stats_.bucket_start_times[next_bucket_ - 1] = ReductionStats::Clock::now();
      bucket.powersgd = powersgd_->Launch(bucket.parameters, grads, &stats_.bytes);
    } else if (options_.comm_hook == CommHook::kNone || powersgd_) {
      bucket.work = group_->AllReduce(bucket.buffer, ReduceOp::kAverage);
      stats_.bytes += bucket.buffer.numel() * bucket.buffer.element_size();
    } else {
      // Divide before the cast so the 16-bit sum cannot overflow where the average would not.
      bucket.compressed = (bucket.buffer / group_->size()).to(CompressedType(options_.comm_hook));
      bucket.work = group_->AllReduce(bucket.compressed, ReduceOp::kSum);
      stats_.bytes += bucket.compressed.numel() * bucket.compressed.element_size();
    }
  }
}

void Reducer::Finalize() {
  if (!armed_) throw std::logic_error("Reducer: Finalize() without Prepare()");
  armed_ = false;
  if (next_bucket_ < buckets_.size()) {
    std::string missing;
    for (size_t index = 0; index < parameters_.size(); ++index) {
      if (!ready_[index]) missing += (missing.empty() ? "" : ", ") + names_[index];
    }
    throw std::logic_error(
        "Reducer: no gradient arrived for " + missing +
        ". Parameters that take no part in the loss need find_unused_parameters; every rank "
        "must use the same parameters or enable it");
  }
  const auto wait_start = ReductionStats::Clock::now();
  for (size_t b = 0; b < buckets_.size(); ++b) {
    Bucket& bucket = *buckets_[b];
    if (bucket.powersgd) {
      powersgd_->Finish(*bucket.powersgd, &stats_.bytes);
      stats_.allreduce += ReductionStats::Clock::now() - stats_.bucket_start_times[b];
      bucket.powersgd.reset();
      continue;
    }
    if (!bucket.work) continue;
    bucket.work->Wait();
    stats_.bucket_start_times[b] = bucket.work->start_time();
    stats_.allreduce += bucket.work->end_time() - bucket.work->start_time();
    if (bucket.compressed.defined()) {
      bucket.buffer.copy_(bucket.compressed);
      bucket.compressed = at::Tensor();
    }
    bucket.work.reset();
  }
  stats_.wait = ReductionStats::Clock::now() - wait_start;
  stats_.buckets = static_cast<int>(buckets_.size());
  if (powersgd_) powersgd_->EndStep();
}

}  // namespace gradhub::ddp
