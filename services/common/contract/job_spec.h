#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gradhub/v1/jobs.pb.h"
#include "services/common/contract/proto_values.h"

namespace gradhub {

// The JobSpec as users write it: YAML or JSON in the proto3 JSON mapping (camelCase names,
// enum value names; JSON is YAML, so one parser reads both). Unknown fields and enum values
// are errors, so a typo is never silently ignored. Enum names are matched case-insensitively
// (`backend: auto` works). The JSON is read as every request's is (ParseProtoJson): a list
// only for a list field, no field twice, values the proto means. Throws UserError naming the
// field or the parse position.
v1::JobSpec ParseJobSpec(const std::string& text);
v1::JobSpec LoadJobSpec(const std::string& path);

// `field` is the proto JSON path, e.g. "distributed.worldSize".
using SpecIssue = FieldIssue;

struct SpecLimits {
  int max_world_size = 1024;
};

// Every problem with the spec, not only the first, so a user fixes them in one go (one per
// field): first the values no spec can mean (ProtoValueIssues: enum numbers without a name,
// NaN and infinities, NUL and invalid UTF-8, anywhere in the spec), then the rules of each
// field. Length limits count characters (Unicode code points, text_rules.h). parallelism.*:
// CheckParallelismFields, CheckPipelineShape and CheckPipelineCombinations in job_spec.cc state
// the rules in steps.
std::vector<SpecIssue> ValidateJobSpec(const v1::JobSpec& spec, const SpecLimits& limits = {});

// Throws UserError listing every issue ValidateJobSpec finds.
void CheckJobSpec(const v1::JobSpec& spec, const SpecLimits& limits = {});

// ---------------------------------------------------------------------------------------------
// Where a rank trains. The one statement of which devices a spec allows: the scheduler places
// by it (scheduling_rules.h DeviceKindsFor), ValidateJobSpec refuses the combinations no device
// serves (FP16 with backend GLOO), and the trainer checks the device its rank landed on
// (CheckRankDevice).

// The device a rank's node gives it (the node's device kind, GRADHUB_DEVICE).
enum class RankDevice { kCpu, kCuda };

// The settings of `spec` that need a CUDA GPU, each as the issue a rank that trains on the CPU
// raises, naming its field: backend NCCL (it reduces GPU tensors) and precision FP16 (autocast
// to float16, which the CPU's autocast lacks). `where` says why the rank is on the CPU, e.g.
// "this rank trains on the CPU". Empty = the spec trains on either device.
std::vector<SpecIssue> CudaOnlySettings(const v1::JobSpec& spec, const std::string& where);
bool NeedsCuda(const v1::JobSpec& spec);
// backend GLOO: the ranks train on the CPU whatever device their node has (Gloo reduces CPU
// tensors), so the scheduler gives them CPU nodes, where no GPU sits idle.
bool TrainsOnCpu(const v1::JobSpec& spec);
// A pipeline of schedule INTERLEAVED_ONE_F_ONE_B: its transfers go around the replica's ring,
// in an order NCCL's one stream cannot take, so it runs on Gloo only. ValidateJobSpec refuses
// it with backend NCCL; with AUTO the scheduler gives it CPU nodes, where AUTO is Gloo.
bool RunsOnGlooOnly(const v1::JobSpec& spec);

struct RankDeviceRules {
  bool allow_fp16_on_cpu = false;  // tests only: the trainer's fp16_scaling_on_cpu_for_test
};
// Rules that depend on the device a rank landed on (NCCL and FP16 need CUDA). Throws UserError
// naming the field. The scheduler places a valid spec only where this passes; the trainer
// checks again, for a rank started by hand or by an older scheduler.
void CheckRankDevice(const v1::JobSpec& spec, RankDevice device, const RankDeviceRules& rules = {});

// ---------------------------------------------------------------------------------------------
// Pipeline model parallelism (JobSpec.parallelism): the shape of a job's ranks as every
// component reads it. world size = stages x replicas; rank = replica * stages + stage.

struct Parallelism {
  int32_t stages = 1;            // 1 = no pipeline (pipelineStages 0 or 1)
  int32_t replicas = 1;          // data-parallel replicas: world size / stages
  int32_t micro_batches = 1;     // a replica's batch is split into these (microBatches 0 = stages)
  int32_t chunks_per_stage = 1;  // model chunks per rank: 2 by default with the interleaved
                                 // schedule, else 1
  bool pipelined() const { return stages > 1; }
};
// The parallelism of a spec, its defaults applied. For a spec ValidateJobSpec accepts; on one
// it refuses (stages not dividing the world size), replicas is the world size / stages
// rounded down, at least 1.
Parallelism ParallelismOf(const v1::JobSpec& spec);

// Samples per optimizer step (the global batch): batchSizePerRank x data-parallel replicas x
// gradAccumulationSteps. Without a pipeline the replicas are the ranks; with one, a replica's
// stages share their samples.
int64_t GlobalBatchSize(const v1::JobSpec& spec);

// The spec with the documented default written in wherever a field left it zero (world size
// 1, bucket cap 25 MiB, keep_last 3, with a pipeline microBatches = pipelineStages and,
// interleaved, chunksPerStage 2). The one place where those defaults live.
v1::JobSpec WithDefaults(v1::JobSpec spec);

}  // namespace gradhub
