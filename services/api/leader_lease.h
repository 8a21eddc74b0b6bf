// Which gradhub-api replica leads: the one that runs the scheduler's passes (node-loss
// judgement, attempts and the hang watchdog, cancellations, the queue). Every replica serves
// calls; only the leader's background work changes state on its own. Chosen through one row
// of PostgreSQL (migrations/0016_leader_lease.sql), so the leader needs nothing the replicas
// do not already share.
//
// The protocol, the leader running Tick every lease/4 and the other replicas every lease/10:
//   1. Takeover. A replica that does not lead locks the row (SELECT ... FOR UPDATE, waiting at
//      most lease/4) and, if the term in it has expired by the database's clock, starts the
//      next one: holder = itself, term + 1, expires_at = the database's now + lease.
//   2. Renewal. The leader moves expires_at to now + lease, only while its own term is still
//      in the row and unexpired. A renewal that finds it expired is a lost term, never
//      renewed: the replica takes over afresh (step 1), with a new term, as if it had just
//      started (a pause or an outage may have hidden anything meanwhile).
//   3. Local expiry. The leader acts only until `sent + lease - margin`, `sent` being its own
//      steady clock when it sent the last successful renewal (or takeover). The database set
//      its expiry from a later moment, so the leader stops believing it leads before the
//      database lets anyone take over: it steps down before its lease ends, whether its
//      renewals fail (cut off from PostgreSQL) or are late (paused: SIGSTOP, a frozen VM). The
//      steady clock runs on through a pause, so a leader that wakes knows its term is over.
//   4. Fencing. Every transaction of the leader's work starts with Fence(term): the row must
//      still hold this replica's term, unexpired by the database's clock, and is share-locked
//      (FOR KEY SHARE) until the transaction ends. A takeover's FOR UPDATE waits for those
//      locks, so a deposed leader's transaction either commits before the next term begins or
//      fails its fence: its writes never interleave with the new leader's. A renewal (a plain
//      UPDATE of a non-key column) does not conflict with the share locks, so a leader's own
//      passes never delay its renewals.
//   5. A leader's transaction left idle by a pause is ended by PostgreSQL after a lease
//      (idle_in_transaction_session_timeout, set by Fence), so a frozen leader cannot hold
//      the row's lock, and the takeover, for long; its writes roll back.
//   6. Stop releases the term (expires_at = -infinity), so another replica takes over at its
//      next tick instead of after a lease.
//
// Failure cases:
//   - The database unreachable: renewals fail, the leader steps down at its local expiry
//     (step 3) and nobody leads until the database is back; then one replica takes over.
//   - The leader killed: its term expires a lease after its last renewal; the first replica
//     to tick after that takes over, between lease*3/4 and lease*11/10 after the kill.
//   - Clocks: expiries are compared only with the database's clock (clock_timestamp()), and
//     local expiry only with the replica's own steady clock: no two clocks are compared.
//
// Thread-safety: Tick from one thread at a time (the lease's own thread, or a test); Current,
// Fence and leader() from any thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "services/common/db/pool.h"

namespace gradhub::api {

struct LeaderLeaseOptions {
  // This replica, as the row and the logs name it. Empty: host, pid and a random part.
  std::string holder;
  // How long a term lasts without a renewal: the longest time without a leader after the
  // leader dies (plus a tick), and the shortest pause that deposes one.
  absl::Duration lease = absl::Milliseconds(1500);
  // Called from the ticking thread with false when a term of this replica ends, and with true
  // when one begins (a pause that ended a term: false, then true for the next).
  std::function<void(bool leading)> on_change;
};

// A term this replica holds.
struct LeaderTerm {
  int64_t number = 0;
  // This replica's clock when the term began. Work that judges silence (nodes' heartbeats,
  // ranks' steps) counts it from here at the earliest: the previous leader, or this replica
  // before a pause, may not have been recording anything.
  absl::Time began;
};

// What a replica last saw in the row, for readyz and logs.
struct LeaderView {
  std::string holder;  // "" = nobody holds an unexpired term
  int64_t term = 0;
};

// The local-expiry rule (protocol step 3): the moment this replica stops acting on a term
// renewed or taken at `sent`.
std::chrono::steady_clock::time_point LocalTermExpiry(std::chrono::steady_clock::time_point sent,
                                                      absl::Duration lease);

// A replica identity: "host:pid:random", unique across restarts of the same process id.
std::string NewReplicaIdentity();

class LeaderLease {
 public:
  LeaderLease(db::Pool* pool, LeaderLeaseOptions options);
  ~LeaderLease();  // Stop
  LeaderLease(const LeaderLease&) = delete;
  LeaderLease& operator=(const LeaderLease&) = delete;

  // Ticks on a thread of its own until Stop: every lease/4 while leading, lease/10 otherwise.
  void Start();
  // Ends the thread and releases a held term (protocol step 6). Idempotent.
  void Stop();

  // One renewal or takeover attempt (protocol steps 1-2).
  absl::Status Tick();

  // The term this replica holds now by its own clock (step 3), or nullopt.
  std::optional<LeaderTerm> Current() const;
  // Protocol step 4, first in every transaction of the leader's work: FAILED_PRECONDITION
  // naming the term when it is no longer this replica's.
  absl::Status Fence(db::Transaction& tx, int64_t term) const;

  // Who leads, as of the last tick.
  LeaderView leader() const;
  // That as one line: "leader: this replica (<holder>, term N)", "leader: <holder> (term N)",
  // or "leader: none (...)".
  std::string Describe() const;
  const std::string& holder() const { return options_.holder; }
  absl::Duration lease() const { return options_.lease; }

 private:
  using Clock = std::chrono::steady_clock;

  absl::Status Renew(int64_t term, Clock::time_point sent);
  absl::Status TakeOver(Clock::time_point sent);
  void Release();
  // After a failed tick: a term past its local expiry is recorded as over (step 3), although
  // nothing could be read.
  void StepDownIfExpired();
  // Records the outcome of a tick (`view` nullopt: who leads is unknown, kept as it was);
  // reports a change of leadership (a line on stderr, on_change).
  void SetHeld(std::optional<LeaderTerm> term, Clock::time_point expiry,
               std::optional<LeaderView> view);

  db::Pool* pool_;
  LeaderLeaseOptions options_;

  mutable std::mutex mu_;
  std::optional<LeaderTerm> term_;  // held as of the last tick; valid until expiry_
  Clock::time_point expiry_;
  LeaderView view_;
  bool stopping_ = false;
  std::condition_variable wake_;
  std::thread thread_;
};

}  // namespace gradhub::api
