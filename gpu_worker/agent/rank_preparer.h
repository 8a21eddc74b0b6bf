// Prepares every rank the agent is to start, trainer or script, off the protocol loop, which
// must keep heartbeating while code downloads and the api answers. For each rank, on a thread
// of its own:
//   1. its identity: with a root agent, its job's uid on this node (job_uids.h: one uid per job,
//      never one a process of another job still runs as), else the node's rank identity;
//   2. script ranks only, the code: fetched once per node (CodeCache: downloaded,
//      sha256-checked, kept by digest) and unpacked once per attempt (UnpackAttemptCode);
//   3. its credential: IssueRankCredential with the node token, a token of the rank's job,
//      attempt and rank that is all the rank ever gets (the node token and session never reach
//      a rank's environment, argv or files).
// Poll() starts that on the first call for a rank and answers nullopt until it is done; the
// agent does not start the rank meanwhile (its key stays unseen, so every reconcile asks
// again) and `on_ready` wakes the loop when a preparation ends.
//
// The credential's call is retried while the api cannot be reached (gRPC UNAVAILABLE: a replica
// killed mid-call, none reachable), with backoff, for up to the agent's api outage grace, the
// time it also keeps running ranks without the api: a placement must not fail because the
// replica that answered the heartbeat died before the credential. Safe to repeat: each call
// issues a new token, and one whose answer was lost reached nobody and dies with the attempt.
// Any other answer (the rank no longer placed here: NOT_FOUND; a bad node token) ends it.
//
// Errors, named by their step: a script's code that is missing or refused keeps its code
// (NOT_FOUND, INVALID_ARGUMENT: the user's fault); every other failure, the credential's
// included, is the node's (UNAVAILABLE, RESOURCE_EXHAUSTED, ...), never NOT_FOUND or
// INVALID_ARGUMENT.
//
// Thread-safe: Poll from the protocol loop; preparations run on their own threads, joined by
// the destructor.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "gpu_worker/agent/code_cache.h"
#include "gpu_worker/agent/config.h"
#include "gpu_worker/agent/job_uids.h"
#include "gpu_worker/agent/rank_launch.h"
#include "gpu_worker/agent/reconcile.h"
#include "gradhub/v1/nodes.grpc.pb.h"

namespace gradhub::agent {

class RankPreparer {
 public:
  // `stub` is not owned and must outlive this. `code_cache` is owned by the caller too.
  RankPreparer(const AgentConfig& config, v1::NodeService::StubInterface* stub,
               CodeCache* code_cache, std::function<void()> on_ready);
  ~RankPreparer();
  RankPreparer(const RankPreparer&) = delete;
  RankPreparer& operator=(const RankPreparer&) = delete;

  // nullopt while `assignment`'s rank is being prepared (the first call starts it), then its
  // result, once: a later call for the same rank starts over. `known_jobs`: the ids (uuids) of
  // the jobs whose ranks the agent still knows (running or reported), which keep their uids
  // (job_uids.h rule 4).
  std::optional<absl::StatusOr<PreparedRank>> Poll(const v1::RankAssignment& assignment,
                                                   const std::string& session_id,
                                                   const std::set<std::string>& known_jobs);

 private:
  struct Preparation {
    std::string job_id;
    std::thread thread;
    bool done = false;
    absl::StatusOr<PreparedRank> result = absl::UnknownError("not prepared yet");
  };

  absl::StatusOr<PreparedRank> Prepare(const v1::RankAssignment& assignment,
                                       const std::string& session_id,
                                       const std::set<std::string>& active_jobs);
  absl::StatusOr<RankIdentity> IdentityOf(const std::string& job_id,
                                          const std::set<std::string>& active_jobs);  // step 1
  absl::Status UnpackCode(const v1::RankAssignment& assignment, const RankLaunch& paths,
                          PreparedRank* prepared);  // step 2
  absl::StatusOr<std::string> IssueCredential(const v1::RankAssignment& assignment,
                                              const std::string& session_id);  // step 3

  const AgentConfig& config_;
  v1::NodeService::StubInterface* const stub_;
  absl::Notification stopping_;  // the destructor's: credential retries give up
  CodeCache* const code_cache_;
  const std::function<void()> on_ready_;
  JobUids uids_;
  absl::Mutex mu_;
  std::map<RankKey, std::unique_ptr<Preparation>> preparations_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> finished_ ABSL_GUARDED_BY(mu_);  // to join
};

// IssueRankCredential with the node token `node_token`, each try given `try_timeout`, tried
// again after UNAVAILABLE (backoff 100 ms doubling to 1 s) until `patience` has passed since
// the first try or `stopping` is notified; the token, or the last failure.
absl::StatusOr<std::string> IssueRankCredential(v1::NodeService::StubInterface& stub,
                                                const v1::IssueRankCredentialRequest& request,
                                                const std::string& node_token,
                                                absl::Duration try_timeout, absl::Duration patience,
                                                const absl::Notification& stopping);

// The directories of job `job_id` on this node that its uid owns: <work-dir>/jobs/<id>, and
// with a checkpoint server (the checkpoint root is then this node's cache) <checkpoint
// root>/<id>; without one the checkpoint root may be shared with other nodes, whose ranks of
// the job may still use it. What DisownJobFiles gives to root when the job's uid is released;
// `job_id` "" = every job's (an agent starting, which knows no job's uid).
std::vector<std::string> JobDirectories(const AgentConfig& config, const std::string& job_id);

}  // namespace gradhub::agent
