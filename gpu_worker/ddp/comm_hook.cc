#include "gpu_worker/ddp/comm_hook.h"

#include <ATen/ATen.h>

#include <stdexcept>

namespace gradhub::ddp {
namespace {

// One collective's Work, and a step to run once it completed.
class WorkReduction final : public PendingReduction {
 public:
  WorkReduction(std::shared_ptr<Work> work, int64_t bytes, std::function<void()> after = nullptr)
      : work_(std::move(work)), bytes_(bytes), after_(std::move(after)) {}

  ReductionCost Finish() override {
    work_->Wait();
    if (after_) after_();
    return {work_->start_time(), work_->end_time(), bytes_};
  }

 private:
  std::shared_ptr<Work> work_;
  int64_t bytes_;
  std::function<void()> after_;
};

}  // namespace

std::unique_ptr<PendingReduction> AllReduceAverage(ProcessGroup& group, const at::Tensor& buffer) {
  return std::make_unique<WorkReduction>(group.AllReduce(buffer, ReduceOp::kAverage),
                                         static_cast<int64_t>(buffer.nbytes()));
}

CastCompressHook::CastCompressHook(at::ScalarType dtype) : dtype_(dtype) {
  if (dtype != at::kHalf && dtype != at::kBFloat16) {
    throw std::invalid_argument(std::string("CastCompressHook: dtype must be float16 or "
                                            "bfloat16, got ") +
                                c10::toString(dtype));
  }
}

std::string CastCompressHook::name() const { return dtype_ == at::kHalf ? "fp16" : "bf16"; }

std::unique_ptr<PendingReduction> CastCompressHook::Launch(const GradBucket& bucket,
                                                           ProcessGroup& group) {
  at::Tensor compressed = (bucket.buffer / group.size()).to(dtype_);
  auto work = group.AllReduce(compressed, ReduceOp::kSum);
  at::Tensor buffer = bucket.buffer;
  return std::make_unique<WorkReduction>(
      std::move(work), static_cast<int64_t>(compressed.nbytes()),
      [buffer, compressed]() mutable { buffer.copy_(compressed); });
}

}  // namespace gradhub::ddp
