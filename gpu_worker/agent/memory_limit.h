// Per-rank memory limits: one memory cgroup per rank where the agent can create cgroups,
// else an rlimit the rank's process inherits.
//
// Mechanisms, as ChooseMemoryMechanism picks them (cgroup v2, then v1, then the rlimit):
//   - cgroup v2 (<parent>/<rank>/memory.max = limit, memory.swap.max = 0). Covers everything
//     the kernel charges to the group: anonymous memory of every process the rank forks, page
//     cache it reads, shared memory it creates (Gloo's shared-memory allreduce segments),
//     kernel memory. Over the limit the kernel reclaims, then its OOM killer kills a process
//     of the group (not one outside it); memory.events' oom_kill counts that. Needs a parent
//     whose subtree_control can enable "memory" (the root, or a delegated cgroup).
//   - cgroup v1 (<memory mount>/<parent>/<rank>/memory.limit_in_bytes, memsw too where swap
//     accounting exists). Covers the same charges; memory.oom_control's oom_kill counts kills.
//   - RLIMIT_DATA (setrlimit between fork and exec). Covers the private writable mappings of
//     each process (malloc, anonymous mmap: all of libtorch's tensors) since Linux 4.7; an
//     allocation over it fails (the trainer exits kExitOutOfMemory with the message), nothing
//     is killed. Does NOT cover shared memory, page cache, kernel memory, or the sum over
//     processes: each forked child gets the limit anew. RLIMIT_AS would also count libtorch's
//     and glibc's large PROT_NONE reservations and fail healthy ranks.
// The parent of the rank cgroups is, by default, the agent's own cgroup (so whatever limit a
// container puts on the agent still holds for its ranks), with one child per agent process.
//
// Thread-safety: a MemoryCgroup is used by one thread at a time (the agent creates it, the
// RankProcess supervisor thread reads and removes it).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace gradhub::agent {

enum class MemoryMechanism { kNone, kCgroupV2, kCgroupV1, kRlimit };
const char* MemoryMechanismName(MemoryMechanism mechanism);

// What the agent found on its machine (ProbeCgroups), or what a test pretends it found.
struct CgroupProbe {
  // Directory under which rank cgroups go, "" when that version cannot be used here: for v2
  // a writable cgroup whose cgroup.controllers lists "memory"; for v1 the agent's cgroup in
  // the memory hierarchy, writable.
  std::string v2_parent;
  std::string v1_parent;
};

// The probe of this machine, as root or not. `override_parent` (--cgroup-parent), when set,
// is used for whichever version mounts it.
CgroupProbe ProbeCgroups(const std::string& override_parent);

// `requested` is "auto", "cgroup-v2", "cgroup-v1", "rlimit" or "none" (--memory-isolation).
// A limit <= 0 means none. INVALID_ARGUMENT naming --memory-isolation for a mechanism this
// machine lacks or an unknown name. Auto: v2, else v1, else the rlimit.
absl::StatusOr<MemoryMechanism> ChooseMemoryMechanism(const std::string& requested,
                                                      int64_t limit_bytes,
                                                      const CgroupProbe& probe);

// The name of an agent's cgroup directory: gradhub-agent-<node>-<12 hex digits of the
// sha256 of its work dir>. The same for a restarted agent (same node, same work dir), so it
// finds what its predecessor left (RemoveLeftoverCgroups); different for two agents on one
// machine, even of the same node name (test clusters side by side), so one never removes, or
// kills the ranks of, the other's cgroups.
std::string AgentCgroupName(const std::string& node_name, const std::string& work_dir);
// How every AgentCgroupName begins (job_uids.h recognizes ranks' cgroups by it).
inline constexpr std::string_view kAgentCgroupPrefix = "gradhub-agent-";

// <parent>/<name>: the directory of this agent's rank cgroups, created if missing (with the
// memory controller delegated to it on v2).
absl::StatusOr<std::string> PrepareAgentCgroup(MemoryMechanism version, const std::string& parent,
                                               const std::string& name);

// One rank's memory cgroup: created with the limit set, joined by the child between fork and
// exec (through procs_fd), removed once the rank has exited.
class MemoryCgroup {
 public:
  // Creates <parent>/<name> with `limit_bytes`. For v2 the parent's subtree_control gets
  // "+memory" first.
  static absl::StatusOr<std::unique_ptr<MemoryCgroup>> Create(MemoryMechanism version,
                                                              const std::string& parent,
                                                              const std::string& name,
                                                              int64_t limit_bytes);
  ~MemoryCgroup();  // Remove(), best effort
  MemoryCgroup(const MemoryCgroup&) = delete;
  MemoryCgroup& operator=(const MemoryCgroup&) = delete;

  // cgroup.procs opened for writing: the child writes its pid there before exec.
  int procs_fd() const { return procs_fd_; }
  const std::string& path() const { return path_; }
  int64_t limit_bytes() const { return limit_bytes_; }
  // Times the kernel's OOM killer killed a process of this group.
  int64_t OomKills() const;
  // Most memory the group was charged (v1 max_usage_in_bytes, v2 memory.peak); 0 if unknown.
  int64_t PeakBytes() const;
  // SIGKILLs every process in the group (from cgroup.procs).
  void KillAll() const;
  // rmdir; true once gone. Fails (false) while a process is still in it.
  bool Remove();

 private:
  MemoryCgroup(MemoryMechanism version, std::string path, int procs_fd, int64_t limit_bytes)
      : version_(version), path_(std::move(path)), procs_fd_(procs_fd), limit_bytes_(limit_bytes) {}
  MemoryMechanism version_;
  std::string path_;
  int procs_fd_;
  int64_t limit_bytes_;
  bool removed_ = false;
};

// "oom_kill N" from memory.events (v2) or memory.oom_control (v1) text; 0 when absent.
int64_t ParseOomKills(const std::string& text);

// Removes the rank cgroups a previous agent left under `dir` (a crashed agent cannot rmdir
// them), SIGKILLing what still runs in them first; returns how many are gone. "" = none.
int RemoveLeftoverCgroups(const std::string& dir);

// /proc/meminfo's MemTotal in bytes; 0 if unreadable.
int64_t MachineMemoryBytes();

}  // namespace gradhub::agent
