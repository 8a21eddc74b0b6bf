// What one gradhub-api replica tells the others, over PostgreSQL LISTEN/NOTIFY (db::Listener):
// every replica serves agents' WatchAssignments streams and takes CreateJob and CancelJob, but
// the change behind them may be made by another replica (issue 35).
//
// Channels (ReplicaChannels) and what a replica does on each:
//   gradhub_assignments   a node's desired set may have changed: wake the local streams
//                         (AssignmentNotifier::Notify); each reads its node's set again.
//   gradhub_jobs_created  payload "jobs/<uuid>", a job just committed: Scheduler::JobCreated.
//   gradhub_nudge         something the scheduler acts on changed (a cancel, a node, a rank):
//                         Scheduler::Nudge.
// A signal is a hint: the receiver reads the state from the database afterwards, so a
// duplicate costs a read and a lost one is made up by the receiver's own periodic work
// (scheduler passes every interval, agents' heartbeats, which also carry the desired set).
//
// Protocol:
//   1. A change commits on replica A, which calls its local receiver at once (the in-process
//      path: a lone replica loses no latency) and then Publish...() here.
//   2. Publish queues the signal and returns; the sender thread sends everything queued in one
//      statement (pg_notify per signal), so a burst of creates costs one round trip.
//   3. PostgreSQL delivers it to every listening replica, A included. A drops its own job
//      names (it had them at step 1): each made its scheduler try the job again and run a full
//      pass, which under a stream of creates doubled the scheduler's work per create.
//   4. The receiving replica's Listener thread calls the matching callback, which reads the
//      state again (step 1's commit happened before step 2, so it sees the change).
//   5. A replica whose listener reconnected may have missed signals: it calls
//      on_assignments_changed and on_nudge, i.e. reads everything again.
//
// Why after the commit (Notify(Pool&)) and not inside the transaction that made the change:
// those transactions belong to JobInserter's group commit and the scheduler's passes, which
// report a change only once it committed; correctness needs only that the signal leaves after
// the commit (step 4). What it costs is the window between commit and send: a replica that
// dies there, or a database that fails the send, loses the signal, and the others learn of the
// change from their periodic work (above), within an interval or a heartbeat.
//
// Failure cases: a send that fails is logged (once per run of failures) and dropped; a
// payload on gradhub_jobs_created that is not a job name is logged and taken as a nudge (a
// full pass finds whatever was created); more than kMaxQueuedJobs names waiting to be sent
// become one nudge.
//
// Thread-safety: Start, Stop and the destructor from the owning thread; Publish... from any
// thread. The callbacks run on the listener's thread.
#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "absl/status/status.h"
#include "services/common/db/connection.h"
#include "services/common/db/listener.h"
#include "services/common/db/pool.h"

namespace gradhub::api {

// The channel names, here only.
struct ReplicaChannels {
  static constexpr char kAssignments[] = "gradhub_assignments";
  static constexpr char kJobsCreated[] = "gradhub_jobs_created";
  static constexpr char kNudge[] = "gradhub_nudge";
};

struct ReplicaSignalsOptions {
  // The listener's own connection (not the pool's: it stays open, LISTENing).
  db::ConnectionOptions connection;
  std::function<void()> on_assignments_changed;                // required
  std::function<void(const std::string& job)> on_job_created;  // required; "jobs/<uuid>"
  std::function<void()> on_nudge;                              // required
};

class ReplicaSignals {
 public:
  // Names waiting to be sent past which they are sent as one nudge instead.
  static constexpr size_t kMaxQueuedJobs = 1024;

  // `pool` sends (step 2); it must outlive this.
  ReplicaSignals(db::Pool* pool, ReplicaSignalsOptions options);
  ~ReplicaSignals();
  ReplicaSignals(const ReplicaSignals&) = delete;
  ReplicaSignals& operator=(const ReplicaSignals&) = delete;

  // INVALID_ARGUMENT naming a missing callback; otherwise starts listening and sending.
  absl::Status Start();
  // Sends what is queued, then stops both. Idempotent.
  void Stop();
  // Whether the listener is in effect (tests: signals sent before it are not received).
  bool WaitUntilListening(absl::Time deadline) { return listener_.WaitUntilListening(deadline); }

  // Step 2, after the change committed. Never blocks on the database.
  void PublishAssignmentsChanged();
  void PublishJobCreated(const std::string& name);
  void PublishNudge();

 private:
  struct Outbox {
    bool assignments = false;
    bool nudge = false;
    std::vector<std::string> jobs;
    bool empty() const { return !assignments && !nudge && jobs.empty(); }
  };

  // The listener's options, calling Receive and Reconnected on this.
  db::ListenerOptions ListenerOptions();
  // Step 4 for one notification; step 5.
  void Receive(const std::string& channel, const std::string& payload);
  void Reconnected();
  // Whether `name` is a job this replica published and had not heard back yet; forgets it.
  bool HeardOwnJob(const std::string& name);
  void Queue(const std::function<void(Outbox&)>& add);
  void SendLoop();
  absl::Status Send(const Outbox& outbox);

  db::Pool* const pool_;
  ReplicaSignalsOptions options_;
  db::Listener listener_;
  std::mutex mu_;
  std::condition_variable queued_;
  Outbox outbox_;  // guarded by mu_
  // Job names published and not yet heard back (step 3), guarded by mu_. Bounded: past
  // kMaxQueuedJobs it is emptied, and the echoes of what it held reach the callback again.
  std::unordered_set<std::string> own_jobs_;
  bool stopping_ = false;
  std::thread sender_;
};

}  // namespace gradhub::api
