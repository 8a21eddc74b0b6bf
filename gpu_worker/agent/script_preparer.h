// Prepares the ranks of script jobs off the protocol loop, which must keep heartbeating while
// code downloads. For each script rank the agent is to start, on a thread of its own:
//   1. its job's uid (JobUid, script_launch.h), moved on to the next one while another job
//      that this agent prepared holds it, so two jobs here never share one;
//   2. the code: fetched once per node (CodeCache: downloaded, sha256-checked, kept by digest)
//      and unpacked once per attempt (UnpackAttemptCode);
//   3. its credential: IssueRankCredential with the node token, a token of the rank's job and
//      attempt that is all the rank ever gets.
// Poll() starts that on the first call for a rank and answers nullopt until it is done; the
// agent does not start the rank meanwhile (its key stays unseen, so every reconcile asks
// again) and `on_ready` wakes the loop when a preparation ends.
//
// Thread-safe: Poll from the protocol loop; preparations run on their own threads, joined by
// the destructor.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "gpu_worker/agent/code_cache.h"
#include "gpu_worker/agent/config.h"
#include "gpu_worker/agent/reconcile.h"
#include "gpu_worker/agent/script_launch.h"
#include "gradhub/v1/nodes.grpc.pb.h"

namespace gradhub::agent {

class ScriptPreparer {
 public:
  // `stub` is not owned and must outlive this. `code_cache` is owned by the caller too.
  ScriptPreparer(const AgentConfig& config, v1::NodeService::StubInterface* stub,
                 CodeCache* code_cache, std::function<void()> on_ready);
  ~ScriptPreparer();
  ScriptPreparer(const ScriptPreparer&) = delete;
  ScriptPreparer& operator=(const ScriptPreparer&) = delete;

  // nullopt while `assignment`'s rank is being prepared (the first call starts it), then its
  // result, once: a later call for the same rank starts over. The error of a failed
  // preparation names the step (e.g. "code sha256:...: NOT_FOUND ...").
  std::optional<absl::StatusOr<PreparedScript>> Poll(const v1::RankAssignment& assignment,
                                                     const std::string& session_id);

 private:
  struct Preparation {
    std::thread thread;
    bool done = false;
    absl::StatusOr<PreparedScript> result = absl::UnknownError("not prepared yet");
  };

  absl::StatusOr<PreparedScript> Prepare(const v1::RankAssignment& assignment,
                                         const std::string& session_id);
  uint32_t UidFor(const std::string& job_id);  // step 1
  absl::StatusOr<std::string> IssueCredential(const v1::RankAssignment& assignment,
                                              const std::string& session_id);  // step 3

  const AgentConfig& config_;
  v1::NodeService::StubInterface* const stub_;
  CodeCache* const code_cache_;
  const std::function<void()> on_ready_;
  absl::Mutex mu_;
  std::map<RankKey, std::unique_ptr<Preparation>> preparations_ ABSL_GUARDED_BY(mu_);
  std::map<uint32_t, std::string> uid_owners_ ABSL_GUARDED_BY(mu_);  // uid -> job id
  std::vector<std::thread> finished_ ABSL_GUARDED_BY(mu_);           // to join
};

}  // namespace gradhub::agent
