#pragma once

namespace gradhub::trainer {

// How a trainer process ends, so the agent and scheduler can choose: a user error fails the
// job at once, a training failure spends a job restart, an infrastructure failure an
// infrastructure restart.
inline constexpr int kExitSuccess = 0;
inline constexpr int kExitUsage = 2;             // bad command line
inline constexpr int kExitUserError = 10;        // bad spec, unreadable data, shape mismatch
inline constexpr int kExitTrainingFailure = 11;  // NaN/Inf loss
inline constexpr int kExitInfrastructure = 12;   // peer lost, store unreachable, I/O
// Stopped on request (SIGTERM: preemption, drain, cancel); rank 0 saved the last finished step
// first when it could. Counts as infrastructure when no stop was asked of the agent.
inline constexpr int kExitPreempted = 13;
// Ran out of memory: an allocation failed under the agent's RLIMIT_DATA, or the agent saw the
// kernel kill the rank at its memory cgroup's limit (then reported with signal 9 as well).
// A USER failure: the job needs more memory than a slot gives, and retrying will not help.
inline constexpr int kExitOutOfMemory = 14;

}  // namespace gradhub::trainer
