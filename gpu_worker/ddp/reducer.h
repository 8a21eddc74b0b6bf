#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gpu_worker/ddp/autograd_hooks.h"
#include "gpu_worker/ddp/comm/process_group.h"
#include "gpu_worker/ddp/comm_hook.h"

namespace gradhub::ddp {

struct ReducerOptions {
  // Later buckets hold up to this many bytes of gradients (PyTorch's bucket_cap_mb, 25 MiB).
  int64_t bucket_cap_bytes = 25 << 20;
  // The first bucket is small so its allreduce starts early in backward.
  int64_t first_bucket_bytes = 1 << 20;
  // How each bucket is communicated (comm_hook.h: CastCompressHook, PowerSgdHook, or one of
  // the caller's); null averages each bucket with one allreduce. The Reducer shares it with
  // the caller, who may keep it to reach its state (checkpoints).
  std::shared_ptr<CommHook> comm_hook;
  // Detect, each step, parameters that take no part in the loss and count them as ready, so
  // their bucket is still reduced (costs a walk over the autograd graph per step).
  bool find_unused_parameters = false;
  // Finalize from the autograd engine when the backward of a prepared step ends (the first
  // gradient of the step queues it), instead of the caller calling Finalize(): what a front
  // end needs whose user calls loss.backward() alone (gradhub.DistributedDataParallel). A
  // collective's failure then comes out of backward(). A step prepared again before any of
  // its gradients came (a forward whose output never went through backward) is re-armed.
  bool finalize_at_end_of_backward = false;
};

// What one synchronized backward did, for telemetry and for tests of the overlap.
struct ReductionStats {
  using Clock = std::chrono::steady_clock;
  int buckets = 0;
  int64_t bytes = 0;                                  // bytes sent into allreduce, all buckets
  std::vector<Clock::time_point> bucket_start_times;  // when each bucket's allreduce began
  Clock::time_point last_gradient_time{};             // when the last gradient became ready
  std::chrono::nanoseconds wait{0};                   // blocked in Finalize for allreduces
  std::chrono::nanoseconds allreduce{0};              // sum over buckets of allreduce run time
};

// Averages gradients across the ranks of a process group while backward still runs
// (PyTorch's C++ Reducer, Li et al., VLDB 2020).
//
// Buckets. Parameters are assigned to buckets in reverse registration order, because backward
// produces gradients roughly from the last layer to the first: the first bucket fills first.
// Each bucket holds parameters of one dtype in one flat buffer, and every .grad is a view into it
// (gradient-as-bucket-view), so AccumulateGrad writes straight into the buffer that is
// allreduced: no copy in or out.
//
// Protocol of one step, identical on every rank:
//  1. Prepare(): arm the hooks; with find_unused_parameters, mark parameters the autograd
//     graph cannot reach as ready at once.
//  2. During backward, the post-hook of each parameter's AccumulateGrad marks it ready. When
//     a bucket's last parameter is ready, buckets are launched strictly in bucket order (a
//     ready bucket waits for its predecessors) so every rank issues the same collectives in
//     the same order, whatever order gradients arrive in locally.
//     A launch hands the bucket to the comm hook (CommHook::Launch), or without one starts an
//     allreduce averaging it.
//  3. Finalize(): finish every bucket's reduction in bucket order (PendingReduction::Finish:
//     waits, undoes compression, runs a hook's further rounds, e.g. PowerSGD's Q); grads now
//     hold the average. Then CommHook::EndStep.
// After the first synchronized step, buckets are rebuilt once in the order gradients actually
// became ready on rank 0 (broadcast, so every rank uses the same assignment).
//
// Not thread-safe: one training loop drives it; hooks run on the autograd thread of that loop.
class Reducer {
 public:
  Reducer(std::vector<at::Tensor> parameters, std::vector<std::string> names,
          std::shared_ptr<ProcessGroup> group, ReducerOptions options = {});
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  // Step 1, before backward of a synchronized step. `outputs` are the forward's outputs
  // (only read with find_unused_parameters). Throws std::logic_error if the last prepared
  // step was never finalized (see finalize_at_end_of_backward for the one exception).
  void Prepare(const std::vector<at::Tensor>& outputs);
  // Step 3, after backward. Throws CommError if an allreduce failed, and std::logic_error
  // naming the parameters whose gradient never came (unused, without find_unused_parameters).
  void Finalize();

  // Sets every gradient to zero, bucket by bucket (cheaper than per parameter).
  void ZeroGrad();

  // Parameter indices per bucket, in bucket (= launch) order.
  std::vector<std::vector<size_t>> bucket_assignment() const;
  const ReductionStats& last_stats() const { return step_.stats; }
  // options.comm_hook: null without one.
  CommHook* comm_hook() const { return options_.comm_hook.get(); }
  // Replaces options.comm_hook (null: plain averaging) before the first synchronized step, as
  // c10d's register_comm_hook; std::logic_error once a step has been prepared, when buckets
  // may already have gone through the old one.
  void SetCommHook(std::shared_ptr<CommHook> hook);

 private:
  struct Bucket;
  struct Slot {
    size_t bucket = 0;
    int64_t offset = 0;  // elements into the bucket buffer
  };

  // What one synchronized step has done so far (Prepare to Finalize).
  struct Step {
    bool armed = false;
    std::vector<bool> ready;       // by parameter index
    size_t next_bucket = 0;        // first bucket not launched yet
    bool finalize_queued = false;  // finalize_at_end_of_backward: queued on the engine
    ReductionStats stats;
  };
  // The one bucket rebuild, after the first synchronized step.
  struct Rebuild {
    bool first_prepared = false;  // some step has been prepared
    bool done = false;
    std::vector<size_t> ready_order;  // parameters in the order their gradients came
  };

  // Groups parameters (taken in `order`) into buckets by dtype and size, in launch order.
  std::vector<std::unique_ptr<Bucket>> AssignBuckets(const std::vector<size_t>& order) const;
  void BuildBuckets(const std::vector<size_t>& order);
  at::Tensor GradientView(size_t index) const;
  // Makes .grad the bucket view again if something replaced it (zeroed, as a fresh .grad).
  void LinkGradient(size_t index);
  // The autograd hook's entry: queues Finalize (finalize_at_end_of_backward), then marks.
  void OnAutogradGradient(size_t index);
  void OnGradientReady(size_t index);
  // Whether Prepare may arm a step that is still armed: nothing of it began.
  bool MayRearm() const;
  void LaunchReadyBuckets();
  void RebuildBucketsFromRank0();
  [[noreturn]] void ThrowMissingGradients() const;

  std::vector<at::Tensor> parameters_;
  std::vector<std::string> names_;
  std::shared_ptr<ProcessGroup> group_;
  ReducerOptions options_;

  std::vector<std::unique_ptr<Bucket>> buckets_;
  std::vector<Slot> slots_;  // by parameter index
  std::unique_ptr<GradientReadyHooks> hooks_;

  Step step_;
  Rebuild rebuild_;
};

}  // namespace gradhub::ddp
