// Step 1 of the agent protocol (nodes.proto): before registering, an agent stops every trainer
// its previous incarnation left running. A SIGKILLed agent takes its rank leaders with it
// (PR_SET_PDEATHSIG, see rank_process.h), but not what they spawned; an agent stopped by a
// debugger or a kernel that lost the signal can leave the leaders too.
//
// The record is one small pid file per rank process, "pid starttime boot_id", where starttime
// is field 22 of /proc/PID/stat (clock ticks since boot; fixed for a process's lifetime) and
// boot_id is /proc/sys/kernel/random/boot_id. A pid is signalled only while all three still
// match, so a reused pid, or the same pid after a reboot, is never killed.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>

namespace gradhub::agent {

// Field 22 of /proc/PID/stat; nullopt when there is no such process (or it cannot be read).
std::optional<uint64_t> ProcessStartTime(pid_t pid);
// True when `pid` names no process or only a zombie (exited, not yet reaped by its parent).
bool ProcessGone(pid_t pid);
// /proc/sys/kernel/random/boot_id without the newline; empty if unreadable.
std::string BootId();

// Writes the pid file for `pid` (which must exist) atomically. False if it could not.
bool WritePidFile(const std::string& path, pid_t pid);

struct LeftoverReport {
  int files = 0;    // pid files found
  int killed = 0;   // processes (groups) that were still ours and got SIGKILL
  int skipped = 0;  // files naming a process that is gone or is not the recorded one
};

// For every "*.pid" file in `dir` (missing dir = nothing to do): if the recorded process is
// still the same one, SIGKILL its process group (or the process alone if it leads none), then
// remove the file. Does not wait for the processes to die.
LeftoverReport KillLeftovers(const std::string& dir);

}  // namespace gradhub::agent
