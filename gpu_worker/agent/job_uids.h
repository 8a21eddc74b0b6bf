// A uid per job on a node: with a root agent every rank, trainer or script, runs as a uid of its
// job's own from --job-uid-base/--job-uid-count, with a group of the same number (no passwd
// entry is needed), so that a rank of another job, even of the same tenant, can neither signal
// nor ptrace it nor read its /proc entries and its directories (0700 to that uid).
//
// The rules, pure (ChooseJobUid, ReleasableUids: tests/unit/agent/job_uids_test.cc, a test per
// rule):
//   1. A job that holds a uid on this node keeps it: every rank and attempt of the job here runs
//      as that one uid, so they share the job's files (checkpoint cache, code).
//   2. A job that holds none gets the first free uid from its preferred one (PreferredJobUid:
//      base + FNV-1a(job id) % count), wrapping around the range. Free: held by no other job,
//      and run by no process on the node but ranks of this same job. A leftover of an earlier
//      job (one that outlived its rank leader, or that a previous agent started) keeps its uid
//      from every other job: it could otherwise signal or ptrace the new job's ranks and read
//      its files. The same job's ranks that another agent started on this machine (several
//      agents on one host: test clusters) do not: they are known by their memory cgroup
//      (InRankCgroupOfJob), and the job's ranks on the machine then run as one uid. With one uid
//      per agent they could not open each other's shared memory (0600 to its creator), so their
//      gradients went over TCP, whose sums come in another order: whether a job's parameters
//      matched another run's in their last bits depended on which agent started first.
//   3. Every uid of the range taken: RESOURCE_EXHAUSTED, and the rank is not started.
//   4. A held uid is released once the agent knows no rank of its job (none running, none still
//      reported, none being prepared) and no process on the node runs as it. While a leftover
//      process lives, the uid stays its job's (rule 2 keeps it from the others anyway).
// JobUids applies them with the node's processes (/proc/*/status, every Uid field) and, on a
// release, gives the job's node-local directories to root (DisownJobFiles), so that a later job
// that gets the uid cannot enter them.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "gpu_worker/agent/rank_user.h"

namespace gradhub::agent {

// [base, base + count): --job-uid-base and --job-uid-count (main checks count >= 1).
struct UidRange {
  int64_t base = 0;
  int64_t count = 1;
  bool Contains(int64_t uid) const { return uid >= base && uid < base + count; }
};

// The uid job `job_id` tries first: base + FNV-1a(job id) % count. The same on every node and
// for every attempt, so a job usually gets the same uid back (rule 2).
uint32_t PreferredJobUid(const std::string& job_id, const UidRange& range);

// Rules 1 to 3. `holders`: uid -> the job holding it; `in_use`: uids some process on the node
// runs as (any of its real, effective, saved or filesystem uid).
absl::StatusOr<uint32_t> ChooseJobUid(const std::string& job_id, const UidRange& range,
                                      const std::map<uint32_t, std::string>& holders,
                                      const std::set<uint32_t>& in_use);

// Rule 4: the held uids to release, given the jobs the agent still knows (`active_jobs`) and
// the uids in use.
std::vector<uint32_t> ReleasableUids(const std::map<uint32_t, std::string>& holders,
                                     const std::set<std::string>& active_jobs,
                                     const std::set<uint32_t>& in_use);

// The uids in `range` that some process on the node runs as: every Uid field of every
// /proc/<pid>/status (`proc` is /proc but for tests). A process that exits during the scan
// may be missed or not; either is fine (it holds nothing once gone). Processes that
// InRankCgroupOfJob(their /proc/<pid>/cgroup, `except_ranks_of`) are left out (rule 2; "" =
// none).
std::set<uint32_t> UidsInUse(const UidRange& range, const std::string& proc = "/proc",
                             const std::string& except_ranks_of = "");

// Whether a process whose /proc/<pid>/cgroup reads `cgroups` is a rank of job `job_id` that an
// agent started: in some hierarchy its cgroup is <...>/gradhub-agent-<...>/<job
// id>.<attempt>.<rank> (the rank's memory cgroup, memory_limit.h and rank_launch.h). Only root
// creates those and moves processes into them, so no rank can pass for another job's. Agents whose
// memory isolation is an rlimit or none make no such cgroups: their ranks are never recognized.
bool InRankCgroupOfJob(std::string_view cgroups, std::string_view job_id);

// A rank's identity as its job's uid: the node's rank identity when the agent is not root (it
// cannot switch); else `uid` with a group of the same number, and the node's rank group
// (gradhub-rank's) as a supplementary group, for what the node shares with every rank: the
// trainer binary, data roots readable by that group.
RankIdentity JobIdentity(const RankIdentity& node, uint32_t uid);

// The node's job uids. Thread-safe: Acquire runs on rank preparation threads.
class JobUids {
 public:
  // `disown(job_id, uid)` runs when a job's uid is released (rule 4), before the uid can go to
  // another job: it gives the job's directories on this node to root (DisownJobFiles) and
  // removes what the uid left in shared memory (RemoveSharedMemoryLeftovers).
  // `proc` as UidsInUse.
  JobUids(UidRange range, std::function<void(const std::string& job_id, uint32_t uid)> disown,
          std::string proc = "/proc")
      : range_(range), disown_(std::move(disown)), proc_(std::move(proc)) {}

  // The uid of job `job_id`, after releasing what rule 4 allows: `active_jobs` are the jobs the
  // agent still knows (ranks running, reported or being prepared), `job_id` among them or not.
  // RESOURCE_EXHAUSTED as ChooseJobUid.
  absl::StatusOr<uint32_t> Acquire(const std::string& job_id, std::set<std::string> active_jobs);

  // uid -> job, for the agent's log and for tests.
  std::map<uint32_t, std::string> Holders() const;

 private:
  const UidRange range_;
  const std::function<void(const std::string&, uint32_t)> disown_;
  const std::string proc_;
  mutable absl::Mutex mu_;
  std::map<uint32_t, std::string> holders_ ABSL_GUARDED_BY(mu_);
};

// Gives every file under each of `dirs` (missing ones skipped) to root:root, modes unchanged:
// the directories of a job whose uid was released (rule 4). Errors are logged, not returned: a
// file that stays with the old uid is reachable only by a job that learns the old job's id.
void DisownJobFiles(const std::vector<std::string>& dirs);

// Where ranks' Gloo groups keep their shared memory (GlooOptions::shared_memory_dir's default).
inline constexpr char kSharedMemoryDir[] = "/dev/shm";
// How their files are named there (gpu_worker/ddp/comm/gloo/shared_memory_files.cc).
inline constexpr std::string_view kSharedMemoryFilePrefix = "gradhub-";

// Removes the regular files named gradhub-* directly in `directory` (/dev/shm: the Gloo
// shared-memory segments and gradient buffers, gpu_worker/ddp/comm/gloo/shared_memory_files.h)
// whose owner `released` accepts: uids no process runs as any more, so nothing maps the files.
// Ranks unlink them once every rank mapped them; one that dies before leaves its file named,
// up to a gradient bucket's size. Symbolic links and directories are left alone. Returns how
// many it removed; errors are logged.
int RemoveSharedMemoryLeftovers(const std::string& directory,
                                const std::function<bool(uint32_t owner)>& released);

}  // namespace gradhub::agent
