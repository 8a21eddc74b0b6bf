// The agent's side of WatchAssignments (nodes.proto, step 8): a stream kept open beside the
// heartbeat whose messages wake the protocol loop, so that new work and stops reach the node
// at once instead of a heartbeat interval later.
//
//   1. Watch(node, session) points the watch at the agent's current session (after every
//      RegisterNode); the watch thread opens a stream for it.
//   2. Each message counts as news: `wake` is called, and the agent heartbeats at once and
//      reconciles with the heartbeat's answer, never with the message itself (a message can be
//      overtaken by a later placement; the heartbeat's desired set is read after its report).
//      The first message after (re)connecting is news too: whatever changed while the stream
//      was down is picked up by that heartbeat.
//   3. A stream that ends or fails is opened again after a backoff (kGrpcBackoff: 100 ms,
//      doubling to 5 s, jittered); FAILED_PRECONDITION (the session ended) waits for the next
//      Watch; UNIMPLEMENTED (an api without the call) ends the watch: heartbeats alone still
//      converge.
//   4. Stop() cancels the stream and joins the thread.
//
// Thread-safe: Watch, Stop and news() from any thread; `wake` is called on the watch thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "gradhub/v1/nodes.grpc.pb.h"

namespace grpc {
class ClientContext;
}

namespace gradhub::agent {

class AssignmentWatch {
 public:
  // `stub` is not owned and must outlive the watch; `token` is the node token.
  AssignmentWatch(v1::NodeService::StubInterface* stub, std::string token,
                  std::function<void()> wake);
  ~AssignmentWatch();

  void Watch(const std::string& node, const std::string& session_id);
  void Stop();
  // Messages received so far (the agent compares it with the count it last acted on).
  uint64_t news() const { return news_.load(); }

 private:
  void Run();
  // One stream for `session` until it ends; the status it ended with.
  grpc::Status WatchOnce(const std::string& node, const std::string& session);

  v1::NodeService::StubInterface* const stub_;
  const std::string token_;
  const std::function<void()> wake_;
  std::atomic<uint64_t> news_{0};

  std::mutex mu_;
  std::condition_variable changed_;
  std::string node_, session_;           // what to watch; guarded by mu_
  uint64_t session_generation_ = 0;      // bumped by Watch; guarded by mu_
  bool stopping_ = false;                // guarded by mu_
  grpc::ClientContext* open_ = nullptr;  // the stream in flight, to cancel; guarded by mu_
  std::thread thread_;
};

}  // namespace gradhub::agent
