// Script jobs (JobSpec.script): the rules CreateJob applies to them, and the environment the
// agent gives their ranks. One statement of both, so that the api, the agent and the docs
// cannot drift.
#pragma once

#include <string>
#include <vector>

#include "gradhub/v1/jobs.pb.h"
#include "services/common/contract/job_spec.h"

namespace gradhub {

// The interpreter when script.interpreter is empty: Debian's Python with python3-torch.
inline constexpr char kDefaultScriptInterpreter[] = "/usr/bin/python3";

// The variables the agent sets for a script rank, which script.env may not name: torchrun's
// (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, ROLE_RANK, ROLE_WORLD_SIZE,
// GROUP_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_*), GRADHUB_*, CUDA_VISIBLE_DEVICES,
// PYTHONPATH, PYTHONUNBUFFERED, HOME, USER and LOGNAME.
bool IsReservedScriptVariable(const std::string& name);

// Every problem of a script job's spec, each naming its field:
//   1. script.code is "sha256:" and 64 lowercase hex digits;
//   2. script.entrypoint is a relative path without "." or ".." components; args at most 256
//      of at most 4096 bytes; interpreter empty or an absolute path; no NUL anywhere;
//   3. script.env: at most 64 names [A-Z_][A-Z0-9_]*, none reserved (above);
//   4. the built-in trainer's fields are unset (a script runs its own loop, so they would be
//      silently ignored): everything but displayName, labels, priority, seed, nodeSelector,
//      maxRestarts, hangTimeoutSeconds, checkpoint.keepLast and distributed's worldSize,
//      ranksPerNode, backend and collectiveTimeoutSeconds (the ranks' GRADHUB_COLLECTIVE_TIMEOUT).
// The rules every job has (world size, budgets, labels) are ValidateJobSpec's.
std::vector<SpecIssue> ValidateScriptSpec(const v1::JobSpec& spec);

}  // namespace gradhub
