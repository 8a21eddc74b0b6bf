// How the agent starts a rank of a script job (JobSpec.script): the user's program, run the way
// torchrun runs it, as tenant code. What differs from a trainer rank (rank_launch.h):
//   - argv: the interpreter, the entrypoint inside the job's unpacked code, the spec's args;
//   - the environment is torchrun's and gradhub's, never the node token or session (the rank
//     gets a token of its own job and attempt, IssueRankCredential);
//   - its files: the code, unpacked once per attempt on this node into <attempt>/code, the
//     agent's and read-only to the rank; a scratch directory <attempt>/rank-<r>, the rank's,
//     its working directory and HOME;
//   - its identity: as every rank's with a root agent, a uid (and group) of the job's own
//     (job_uids.h), so that a rank of another job on the node can read neither its files nor
//     its /proc entries.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "gpu_worker/agent/config.h"
#include "gpu_worker/agent/rank_launch.h"
#include "gradhub/v1/nodes.pb.h"

namespace gradhub::agent {

// The GPUs a script rank sees (CUDA_VISIBLE_DEVICES): those of every rank of its attempt on
// this node, in local-rank order, so that cuda:LOCAL_RANK is its own, as scripts written for
// torchrun assume (torch.cuda.set_device(LOCAL_RANK)). `assignment` with its device_indices
// so widened; `desired` is the node's whole desired set. A trainer rank sees only its own.
v1::RankAssignment WithLocalRanksDevices(
    const v1::RankAssignment& assignment,
    const google::protobuf::RepeatedPtrField<v1::RankAssignment>& desired);

// The launch plan: PlanRankPaths' directory and pid file, and
//   argv: interpreter (the spec's, /usr/bin/python3 by default), <code_dir>/<entrypoint>, args;
//   env:  RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE GROUP_RANK ROLE_RANK ROLE_WORLD_SIZE
//         ROLE_NAME MASTER_ADDR MASTER_PORT TORCHELASTIC_RESTART_COUNT (attempt - 1)
//         TORCHELASTIC_RUN_ID (the job id) as torchrun sets them; GRADHUB_JOB_ID,
//         GRADHUB_ATTEMPT, GRADHUB_RANK, GRADHUB_WORLD_SIZE, GRADHUB_JOB_TOKEN,
//         GRADHUB_STORE (grpc://<store_address>, the rendezvous store that takes the job
//         token for this attempt's keys; empty without one), GRADHUB_CHECKPOINT_URL,
//         GRADHUB_METRICS_URL, GRADHUB_TLS_CA, GRADHUB_CODE_DIR, GRADHUB_SEED, GRADHUB_DEVICE,
//         GRADHUB_BACKEND, CUDA_VISIBLE_DEVICES, GRADHUB_COLLECTIVE_TIMEOUT (when the spec sets
//         distributed.collectiveTimeoutSeconds) as for a trainer rank; PYTHONPATH (the gradhub
//         module), PYTHONUNBUFFERED=1 (reports and logs arrive as printed), HOME (the scratch
//         directory), USER and LOGNAME; then the spec's env, which ValidateScriptSpec keeps off
//         every name above.
// INVALID_ARGUMENT as PlanRankLaunch, and for an assignment that is not a script's.
absl::StatusOr<RankLaunch> PlanScriptLaunch(const AgentConfig& config,
                                            const v1::RankAssignment& assignment,
                                            const PreparedRank& prepared);

// Creates the scratch directory (launch.dir), `identity`'s and 0700, under jobs/<id> and
// attempt-<n>, root's 0711 (enterable, not listable) when the agent switches users.
absl::Status PrepareScriptFiles(const RankLaunch& launch, const RankIdentity& identity);

// Unpacks `archive` for the attempt whose directory is `attempt_dir`: into attempt_dir/code,
// once (a second rank of the attempt on this node finds it there). The files are the agent's,
// read-only to everyone; the top directory is root:<identity's group> 0750 when the agent
// switches users, so only the job's ranks can enter it. The archive's entries are checked
// again (code_archive.h). Returns the code directory.
absl::StatusOr<std::string> UnpackAttemptCode(const std::string& archive,
                                              const std::string& attempt_dir,
                                              const RankIdentity& identity);

// Rank 0's MASTER_PORT must be free on this node when its rank starts: OK when `port` can be
// bound on every address now, else UNAVAILABLE naming it (something else on the node took it;
// --master-port-base should leave the range to gradhub).
absl::Status CheckMasterPortFree(int port);

}  // namespace gradhub::agent
