// How the agent turns a RankAssignment into a trainer process: its directory, files and
// environment. Pure apart from PrepareRankFiles, so the contract with gradhub-trainer
// (gpu_worker/trainer/main.cc reads these variables) is unit-tested.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "gpu_worker/agent/config.h"
#include "gpu_worker/agent/rank_process.h"
#include "gradhub/v1/nodes.pb.h"

namespace gradhub::agent {

// What a rank needs besides its assignment, made off the protocol loop (rank_preparer.h).
struct PreparedRank {
  RankIdentity identity;  // its job's uid (JobIdentity, job_uids.h), or the node's rank user's
  std::string token;      // the rank's job token (IssueRankCredential)
  std::string code_dir;   // script ranks: the attempt's unpacked code
};

struct RankLaunch {
  std::string job_id;          // the uuid of `jobs/{job_id}`
  std::string dir;             // <work-dir>/jobs/<job_id>/attempt-<n>/rank-<r>
  std::string spec_path;       // <dir>/spec.json
  std::string checkpoint_dir;  // <checkpoint-root>/<job_id>: the store's local cache, or the
                               // checkpoints themselves when the agent has no store
  std::string pid_file;        // <work-dir>/pids/<job_id>.<attempt>.<rank>.pid
  std::vector<std::string> argv;
  // Added to the agent's environment: assignment.env first, then the GRADHUB_* variables
  // below, which win (a rank's identity is the agent's to set):
  //   GRADHUB_SPEC, GRADHUB_RANK, GRADHUB_WORLD_SIZE, GRADHUB_LOCAL_RANK,
  //   GRADHUB_LOCAL_WORLD_SIZE, GRADHUB_JOB_ID, GRADHUB_ATTEMPT,
  //   GRADHUB_STORE=grpc://<store_address> (empty without one: a world of 1 needs none),
  //   GRADHUB_TOKEN=<the rank's job token> (PreparedRank: its job, attempt and rank only, for
  //   the store, the checkpoint store and telemetry; never the node token or session),
  //   GRADHUB_TLS_CA, GRADHUB_CHECKPOINT_DIR, GRADHUB_CHECKPOINT_SERVER,
  //   GRADHUB_METRICS_SERVER, GRADHUB_NODE_NAME (telemetry says where it ran);
  //   CUDA_VISIBLE_DEVICES: the GPUs of device_indices as config.devices names them, empty
  //   for none (the rank then sees no GPU); GRADHUB_DEVICE: cuda when the node is a CUDA node
  //   and the rank has a GPU, else cpu; GRADHUB_BACKEND: the spec's backend with AUTO
  //   resolved here (NCCL on cuda, GLOO on cpu); GRADHUB_COLLECTIVE_TIMEOUT=<n>s when the
  //   spec's distributed.collectiveTimeoutSeconds is set; GRADHUB_DATA_ROOTS (':'-separated,
  //   possibly empty: the shared roots and the assignment's tenant's, RankDataRoots),
  //   GRADHUB_MAX_INPUT_BYTES and GRADHUB_MEMORY_LIMIT_BYTES (RankMemoryLimit) from
  //   config.isolation (the trainer's input policy and its out-of-memory message).
  std::map<std::string, std::string> env;
};

// The directories and pid file of `assignment`'s rank (dir, spec_path, checkpoint_dir,
// pid_file, job_id; no argv, no env), for trainer and script ranks alike. INVALID_ARGUMENT as
// PlanRankLaunch.
absl::StatusOr<RankLaunch> PlanRankPaths(const AgentConfig& config,
                                         const v1::RankAssignment& assignment);

// What both kinds of rank, trainer and script, get of the node's devices and the spec's
// distributed settings, into *env: CUDA_VISIBLE_DEVICES, GRADHUB_DEVICE and GRADHUB_BACKEND
// (see RankLaunch::env), and GRADHUB_COLLECTIVE_TIMEOUT=<n>s when the spec's
// distributed.collectiveTimeoutSeconds is set. The job's timeout overrides the node's, which
// a rank otherwise inherits from the agent's environment (RankInheritsVariable): the job
// knows how slow its steps are; the node only how slow its network is.
//
// A rank sees only the GPU(s) of its assignment's device_indices, through CUDA_VISIBLE_DEVICES,
// rather than every GPU and a local-rank-to-device map: CUDA then numbers them from cuda:0, so
// libtorch and NCCL need no mapping, and a rank of one tenant cannot open another tenant's GPU
// by index, which a map would only ask it not to do. A rank without devices gets an empty list:
// no GPU at all, even where the agent itself was started with some visible.
void SetDistributedEnvironment(const NodeDevices& devices, const v1::RankAssignment& assignment,
                               std::map<std::string, std::string>* env);

// `config.work_dir` and `config.checkpoint_root` must be absolute (main makes them so).
// INVALID_ARGUMENT for a job name that is not `jobs/<id>` with a path-safe id, or a negative
// attempt or rank. `prepared` gives the job token.
absl::StatusOr<RankLaunch> PlanRankLaunch(const AgentConfig& config,
                                          const v1::RankAssignment& assignment,
                                          const PreparedRank& prepared);

// Creates the rank and checkpoint directories and writes the spec (proto3 JSON mapping).
// With a rank user (identity.switch_user: the job's uid), the rank directory, its spec and the
// checkpoint directory with everything in it are that user's (mode 0700/0600: no other job's
// rank may read them; the files of an earlier attempt that ran as another uid, on this node or
// on one sharing the checkpoint root, become this one's), and the directories above them
// root's, searchable but not listable (0711).
absl::Status PrepareRankFiles(const RankLaunch& launch, const v1::RankAssignment& assignment,
                              const RankIdentity& identity = {});

// The isolation part of a rank's RankProcessOptions: its identity, with its tenant's group
// (tenant_roots.h) as a supplementary group when it has roots here, and its memory limit
// (RankMemoryLimit: a new cgroup named <job id>.<attempt>.<rank> under isolation.cgroup_dir,
// or RLIMIT_DATA). INVALID_ARGUMENT as RankMemoryLimit.
absl::Status IsolateRank(const NodeIsolation& isolation, const RankLaunch& launch,
                         const v1::RankAssignment& assignment, RankProcessOptions* options);

}  // namespace gradhub::agent
