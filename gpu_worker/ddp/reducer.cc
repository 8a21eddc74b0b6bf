#include "gpu_worker/ddp/reducer.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <stdexcept>

namespace gradhub::ddp {

struct Reducer::Bucket {
  GradBucket grads;    // index, flat buffer, parameter indices, gradient views
  size_t pending = 0;  // parameters not ready yet in this step
  std::unique_ptr<PendingReduction> reduction;  // launched, not finished
};

Reducer::Reducer(std::vector<at::Tensor> parameters, std::vector<std::string> names,
                 std::shared_ptr<ProcessGroup> group, ReducerOptions options)
    : parameters_(std::move(parameters)),
      names_(std::move(names)),
      group_(std::move(group)),
      options_(std::move(options)) {
  if (names_.size() != parameters_.size()) {
    throw std::invalid_argument("Reducer: one name per parameter is required");
  }
  step_.ready.assign(parameters_.size(), false);
  std::vector<size_t> reverse_order(parameters_.size());
  std::iota(reverse_order.rbegin(), reverse_order.rend(), 0);
  BuildBuckets(reverse_order);
  hooks_ = std::make_unique<GradientReadyHooks>(
      parameters_, [this](size_t index) { OnAutogradGradient(index); });
}

Reducer::~Reducer() = default;

std::vector<std::unique_ptr<Reducer::Bucket>> Reducer::AssignBuckets(
    const std::vector<size_t>& order) const {
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
    open[type]->grads.parameters.push_back(index);
    open_bytes[type] += parameter.numel() * parameter.element_size();
    const int64_t cap = buckets.empty() ? options_.first_bucket_bytes : options_.bucket_cap_bytes;
    if (open_bytes[type] >= cap) close(type);
  }
  while (!open.empty()) close(open.begin()->first);
  // Launch order follows the position of each bucket's first parameter in `order`.
  std::vector<size_t> position(parameters_.size());
  for (size_t i = 0; i < order.size(); ++i) position[order[i]] = i;
  std::stable_sort(buckets.begin(), buckets.end(), [&](const auto& a, const auto& b) {
    return position[a->grads.parameters.front()] < position[b->grads.parameters.front()];
  });
  return buckets;
}

void Reducer::BuildBuckets(const std::vector<size_t>& order) {
  std::vector<std::unique_ptr<Bucket>> buckets = AssignBuckets(order);
  std::vector<Slot> slots(parameters_.size());
  for (size_t b = 0; b < buckets.size(); ++b) {
    GradBucket& grads = buckets[b]->grads;
    grads.index = b;
    int64_t elements = 0;
    for (size_t index : grads.parameters) {
      slots[index] = {b, elements};
      elements += parameters_[index].numel();
    }
    const at::Tensor& first = parameters_[grads.parameters.front()];
    // Where the group reduces it best (in shared memory for Gloo on one host).
    grads.buffer = group_->AllocateCollectiveBuffer(elements, first.options().requires_grad(false));
  }
  buckets_ = std::move(buckets);
  slots_ = std::move(slots);
  // Carry gradients accumulated so far (a rebuild may come in the middle of no_sync), then
  // make every .grad a view into its new bucket; the hooks see the same views, in the
  // bucket's parameter order.
  for (auto& bucket : buckets_) {
    for (size_t index : bucket->grads.parameters) {
      at::Tensor& parameter = parameters_[index];
      at::Tensor view = GradientView(index);
      if (parameter.grad().defined()) view.copy_(parameter.grad());
      parameter.mutable_grad() = view;
      bucket->grads.gradients.push_back(view);
    }
  }
}

at::Tensor Reducer::GradientView(size_t index) const {
  const Slot& slot = slots_[index];
  const at::Tensor& parameter = parameters_[index];
  return buckets_[slot.bucket]
      ->grads.buffer.narrow(0, slot.offset, parameter.numel())
      .view(parameter.sizes());
}

void Reducer::LinkGradient(size_t index) {
  at::Tensor& parameter = parameters_[index];
  const at::Tensor& grad = parameter.grad();
  // Checked by address, without building a view: this runs for every parameter twice a step.
  const Slot& slot = slots_[index];
  const at::Tensor& buffer = buckets_[slot.bucket]->grads.buffer;
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
  for (const auto& bucket : buckets_) assignment.push_back(bucket->grads.parameters);
  return assignment;
}

void Reducer::ZeroGrad() {
  for (size_t index = 0; index < parameters_.size(); ++index) LinkGradient(index);
  for (auto& bucket : buckets_) bucket->grads.buffer.zero_();
}

void Reducer::RebuildBucketsFromRank0() {
  // Every rank must use the same assignment, so rank 0's observed order wins.
  std::vector<int64_t> order(parameters_.size(), -1);
  if (rebuild_.ready_order.size() == parameters_.size()) {
    std::copy(rebuild_.ready_order.begin(), rebuild_.ready_order.end(), order.begin());
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

void Reducer::SetCommHook(std::shared_ptr<CommHook> hook) {
  if (rebuild_.first_prepared) {
    throw std::logic_error(
        "Reducer: a comm hook can only be set before the first synchronized step");
  }
  options_.comm_hook = std::move(hook);
}

bool Reducer::MayRearm() const {
  // No autograd gradient came (it would have queued Finalize) and no collective was issued
  // (find_unused_parameters may launch a bucket of unused parameters from Prepare).
  return options_.finalize_at_end_of_backward && !step_.finalize_queued && step_.next_bucket == 0;
}

void Reducer::Prepare(const std::vector<at::Tensor>& outputs) {
  if (step_.armed && !MayRearm()) {
    throw std::logic_error(
        "Reducer: the previous step's gradients were never finalized; call Finalize() after "
        "every synchronized backward");
  }
  if (!rebuild_.done && step_.stats.buckets > 0) {
    RebuildBucketsFromRank0();
    rebuild_.done = true;
  }
  for (size_t index = 0; index < parameters_.size(); ++index) LinkGradient(index);
  std::fill(step_.ready.begin(), step_.ready.end(), false);
  for (auto& bucket : buckets_) {
    bucket->pending = bucket->grads.parameters.size();
    bucket->reduction.reset();
  }
  step_.next_bucket = 0;
  step_.finalize_queued = false;
  step_.stats = ReductionStats();
  step_.stats.bucket_start_times.assign(buckets_.size(), {});
  step_.armed = true;
  rebuild_.first_prepared = true;
  if (options_.find_unused_parameters) {
    for (size_t index : hooks_->Unreachable(outputs)) OnGradientReady(index);
  }
}

void Reducer::OnAutogradGradient(size_t index) {
  if (step_.armed && options_.finalize_at_end_of_backward && !step_.finalize_queued) {
    step_.finalize_queued = true;
    GradientReadyHooks::QueueAtEndOfBackward([this] { Finalize(); });
  }
  OnGradientReady(index);
}

void Reducer::OnGradientReady(size_t index) {
  if (!step_.armed) return;  // a no_sync step, or a backward outside the DDP step
  if (step_.ready[index]) {
    throw std::logic_error("Reducer: gradient of " + names_[index] +
                           " became ready twice in one step (backward run twice without "
                           "no_sync?)");
  }
  step_.ready[index] = true;
  if (!rebuild_.done) rebuild_.ready_order.push_back(index);
  step_.stats.last_gradient_time = ReductionStats::Clock::now();
  if (--buckets_[slots_[index].bucket]->pending == 0) LaunchReadyBuckets();
}

void Reducer::LaunchReadyBuckets() {
  while (step_.next_bucket < buckets_.size() && buckets_[step_.next_bucket]->pending == 0) {
    Bucket& bucket = *buckets_[step_.next_bucket++];
    if (group_->size() == 1) continue;  // alone, the local gradient is the average
    bucket.reduction = options_.comm_hook ? options_.comm_hook->Launch(bucket.grads, *group_)
                                          : AllReduceAverage(*group_, bucket.grads.buffer);
  }
}

void Reducer::ThrowMissingGradients() const {
  std::string missing;
  for (size_t index = 0; index < parameters_.size(); ++index) {
    if (!step_.ready[index]) missing += (missing.empty() ? "" : ", ") + names_[index];
  }
  throw std::logic_error(
      "Reducer: no gradient arrived for " + missing +
      ". Parameters that take no part in the loss need find_unused_parameters; every rank "
      "must use the same parameters or enable it");
}

void Reducer::Finalize() {
  if (!step_.armed) throw std::logic_error("Reducer: Finalize() without Prepare()");
  step_.armed = false;
  if (step_.next_bucket < buckets_.size()) ThrowMissingGradients();
  ReductionStats& stats = step_.stats;
  const auto wait_start = ReductionStats::Clock::now();
  for (size_t b = 0; b < buckets_.size(); ++b) {
    std::unique_ptr<PendingReduction> reduction = std::move(buckets_[b]->reduction);
    if (!reduction) continue;
    const ReductionCost cost = reduction->Finish();
    stats.bucket_start_times[b] = cost.start;
    stats.allreduce += cost.end - cost.start;
    stats.bytes += cost.bytes;
  }
  stats.wait = ReductionStats::Clock::now() - wait_start;
  stats.buckets = static_cast<int>(buckets_.size());
  if (options_.comm_hook) options_.comm_hook->EndStep();
}

}  // namespace gradhub::ddp
