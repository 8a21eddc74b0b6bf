// The rendezvous store behind StoreService (proto/gradhub/v1/store.proto): a key-value store
// with the semantics of PyTorch c10d's TCPStore, and the waiters blocked on it.
//
// No gRPC in this interface (STYLE.md "gRPC wiring apart from domain logic"): blocking calls
// take a completion callback instead of blocking a thread, so that the gRPC adapter (the
// asynchronous API on one completion-queue thread, store_service.h) can answer them later, and
// a world-size-256 job whose ranks all wait at once holds 256 small records here, not 256
// server threads.
//
// Keys and waiters apart (issue #35: several api replicas on one PostgreSQL). The keys live in a
// RendezvousBackend (rendezvous_backend.h): in memory (the default: tests, one api), or in
// PostgreSQL (gradhub-api), where every replica reads and writes the same keys, so a rendezvous
// survives the death of the replica that took its keys: a client whose replica died retries its
// Get/Wait on another and finds them there. The waiters stay in the memory of the replica the
// client is connected to: they are tied to its open call, and die with it. Why a backend and not
// a store that is always PostgreSQL: the rules (validation, scopes, timeouts, exactly-once
// completion) are the same whatever holds the bytes, and a test or a tool that runs the store
// without a database keeps doing so; one conformance suite holds both backends to the same
// contract (tests/integration/store_service/rendezvous_store_conformance.h).
//
// Protocol of a blocking call (Get / Wait):
//   1. The arguments are checked; an invalid one completes the call at once.
//   2. A waiter is recorded with all its keys missing, indexed under each, and in a
//      deadline-ordered queue; then the backend is read (outside the store's lock): the keys
//      found are marked present. Recording first means a Set that lands during the read is
//      not missed: it finds the waiter. When every key is present the call completes at once
//      (inline, before Get/Wait return, which then return kNoWaiter).
//   3. A key is marked present for every waiter that misses it by:
//        a. a Set/Add on this store, once the backend took it (in-process, no added latency);
//        b. KeysChanged()/KeyChanged(key), which another replica's write brings (a LISTEN/NOTIFY
//           listener calls them): the timer thread polls at once;
//        c. the poll: while any waiter misses a key and the backend is shared, the timer thread
//           reads every missing key of every waiter in ONE query every poll_interval (50 ms).
//           Its cost is bounded: one query per interval per replica, naming the distinct keys
//           missing (a world-N rendezvous misses at most N), and none while nobody waits.
//      A DeletePrefix on this store marks the waiters' keys it deleted missing again.
//   4. The waiter is completed by exactly one of:
//        - its last missing key becoming present (OK, with the value for Get);
//        - the timer thread at its deadline (DEADLINE_EXCEEDED naming the keys still missing,
//          and the last failure to read the backend, if any);
//        - CancelWait(id) (CANCELLED), which the adapter calls when the client cancels;
//        - Shutdown() (UNAVAILABLE), so that a server shutdown is not held up by waiters.
//   The completion callback runs exactly once, never with the store's lock held, on the
//   thread that completed it (the caller of Get/Wait, Set, Add, CancelWait or Shutdown, or
//   the timer thread). It must be quick and must not block on the store's own waiters; it
//   may call back into the store.
// Failure cases:
//   - The backend fails (PostgreSQL down): Set/Add/Check/DeletePrefix return UNAVAILABLE with
//     the cause (retryable); a waiter's read in step 2 or a poll that fails leaves the waiter
//     pending, and the next poll tries again, until its deadline.
//   - A key deleted through another replica after this waiter saw it present is not noticed
//     (step 3 marks keys present, only this store's DeletePrefix marks them missing again);
//     nor is one deleted by a DeletePrefix racing the Set that wrote it. Deleting keys while
//     ranks wait on them is no part of a rendezvous (an attempt's keys go when it ended).
//   - The replica dies: its waiters' calls fail with it; the keys are in the backend.
//
// Cost (measured by rendezvous_store_test's RendezvousCost, 2-core machine, local PostgreSQL):
// with the PostgreSQL backend every Set, Add, Check, DeletePrefix and the first look of a
// Get/Wait is one round trip to the database: a Set took 75 us against 0.2 us in memory. A
// world-8 rendezvous (8 ranks x (Set + Wait on all 8 keys), ranks as threads) took 3.4-5.2 ms
// against 2.5-3.8 ms in memory, most of both being the threads. A waiter completed by a Set on
// the same replica costs nothing more; one completed by another replica's Set waits for
// KeysChanged() or at most poll_interval.
// These calls run on StoreService's queue thread, so one replica's store calls queue behind
// each other's round trips.
//
// Keys: plain byte strings compared as such. Unless `require_attempt_scope` is off, every key
// must lie inside one attempt's prefix `jobs/{job_id}/attempts/{attempt}/` (job_id one
// non-empty path segment, attempt decimal digits) and go on after it; DeletePrefix's prefix
// must start with such a prefix. DeletePrefix is a plain string prefix match: the prefix
// `jobs/a/attempts/1/` does not touch `jobs/a/attempts/10/x`, but a prefix without the
// trailing slash would, which is why the scope rule asks for the full attempt prefix. With the
// PostgreSQL backend an attempt's keys are deleted when the attempt ends (a trigger,
// migrations/0017).
//
// Deleting keys does not fail or wake waiters: like c10d, a waiter waits until all its keys
// are present at the same time, or until its deadline.
//
// Thread-safe: every method may be called from any thread at any time, including from a
// completion callback.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "services/api/rendezvous_backend.h"

namespace gradhub::api {

struct RendezvousStoreOptions {
  // Longest key, in bytes. Longer keys are INVALID_ARGUMENT naming the field.
  size_t max_key_bytes = 512;
  // Largest value, in bytes. Rendezvous values are addresses, NCCL unique ids (128 bytes) and
  // counters; 1 MiB leaves room for anything a rank exchanges while keeping a GetResponse (and
  // a SetRequest) under gRPC's default 4 MiB message limit on both ends, so that an oversized
  // value is refused here with a clear INVALID_ARGUMENT and never by the transport.
  size_t max_value_bytes = size_t{1} << 20;
  // Most keys in one Wait or Check.
  size_t max_keys_per_call = 4096;
  // Most waiters pending at once, over all jobs; more are RESOURCE_EXHAUSTED.
  size_t max_pending_waiters = 1 << 16;
  // Timeout of a blocking call that gives none (or <= 0): c10d's default.
  absl::Duration default_timeout = absl::Seconds(300);
  // Longer timeouts are cut to this.
  absl::Duration max_timeout = absl::Hours(1);
  // Keys (and DeletePrefix prefixes) must lie inside `jobs/{job_id}/attempts/{attempt}/`.
  bool require_attempt_scope = true;
  // How often the timer thread reads the keys waiters miss from a shared backend (protocol
  // step 3c), while any does. KeysChanged() makes it read at once.
  absl::Duration poll_interval = absl::Milliseconds(50);
};

// Checks that `key` starts with an attempt prefix `jobs/{job_id}/attempts/{attempt}/` and, when
// `allow_bare_prefix` is false, goes on after it. INVALID_ARGUMENT naming `field` otherwise.
absl::Status ValidateAttemptScope(const std::string& key, const std::string& field,
                                  bool allow_bare_prefix);

class RendezvousStore {
 public:
  // Identifies a pending waiter; kNoWaiter when the call completed before returning.
  using WaiterId = uint64_t;
  static constexpr WaiterId kNoWaiter = 0;
  using GetCallback = std::function<void(absl::StatusOr<std::string> value)>;
  using WaitCallback = std::function<void(absl::Status status)>;

  // `backend` holds the keys; null: a fresh InMemoryRendezvousBackend.
  explicit RendezvousStore(RendezvousStoreOptions options = {},
                           std::unique_ptr<RendezvousBackend> backend = nullptr);
  // Shuts down (pending waiters complete with UNAVAILABLE) and joins the timer thread.
  ~RendezvousStore();
  RendezvousStore(const RendezvousStore&) = delete;
  RendezvousStore& operator=(const RendezvousStore&) = delete;

  // Creates or overwrites `key`, completing every waiter this makes whole. Returns once the
  // backend holds it (PostgreSQL: committed).
  absl::Status Set(const std::string& key, std::string value);

  // Atomic counter. Creates `key` at 0 if absent, adds `delta`, stores the result as decimal
  // text and returns it. FAILED_PRECONDITION when the key holds anything but a decimal int64
  // (the operation is fine, the state of the key is not); OUT_OF_RANGE on overflow.
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta);

  // Whether all `keys` are present now (one backend read).
  absl::StatusOr<bool> Check(const std::vector<std::string>& keys) const;

  // Deletes every key that starts with `prefix`; returns how many. Idempotent.
  absl::StatusOr<int64_t> DeletePrefix(const std::string& prefix);

  // Completes `done` with the value of `key` once it is present, or with an error (see the
  // protocol above). `timeout` <= 0 means options.default_timeout.
  WaiterId Get(std::string key, absl::Duration timeout, GetCallback done);

  // Completes `done` with OK once all `keys` are present at once, or with an error.
  WaiterId Wait(std::vector<std::string> keys, absl::Duration timeout, WaitCallback done);

  // Completes a pending waiter with CANCELLED. No-op when it already completed.
  void CancelWait(WaiterId id);

  // Another replica wrote keys (protocol step 3b): the timer thread reads the keys waiters
  // miss at once, instead of at its next poll. KeyChanged(key) does so only when a waiter
  // misses `key`. Cheap and non-blocking (they only wake the timer thread): call them from a
  // LISTEN/NOTIFY listener's thread. No-ops while nobody waits.
  void KeysChanged();
  void KeyChanged(const std::string& key);

  // Completes every pending waiter with UNAVAILABLE; later Get/Wait complete at once with
  // UNAVAILABLE. Set/Add/Check/DeletePrefix keep working (they never block). Idempotent.
  void Shutdown();

  // Waiters registered and not yet completed, for tests and metrics. A waiter leaves the count
  // when it is completed, just before (not after) its callback runs.
  size_t pending_waiters() const;
  // Keys stored (by every replica, for a shared backend), for tests and metrics; 0 when the
  // backend cannot say.
  size_t size() const;

  // The timeout a blocking call with `requested` gets: the default for <= 0, capped.
  absl::Duration EffectiveTimeout(absl::Duration requested) const;

  const RendezvousStoreOptions& options() const { return options_; }

 private:
  using Clock = std::chrono::steady_clock;

  struct Waiter {
    std::vector<std::string> keys;  // Distinct, in request order.
    // Keys not seen present (protocol step 3): the waiter is indexed under each in by_key_.
    std::set<std::string> missing;
    bool want_value = false;  // Get: complete with the value of keys[0].
    std::string value;        // Get: keys[0]'s value, once seen.
    absl::Duration timeout;
    Clock::time_point deadline;
    GetCallback get_done;
    WaitCallback wait_done;
  };

  // A completion decided under the lock and delivered after it is released.
  struct Completion {
    Waiter waiter;
    absl::StatusOr<std::string> result;
  };

  absl::Status ValidateKey(const std::string& key, const std::string& field) const;
  absl::Status ValidateKeys(const std::vector<std::string>& keys) const;
  absl::Status ValidatePrefix(const std::string& prefix) const;
  // Protocol steps 2 and 3, for a validated waiter.
  WaiterId Register(Waiter waiter);
  // Records `waiter` with every key missing; kNoWaiter and the status to complete it with when
  // it may not wait. Takes mu_.
  WaiterId RecordWaiter(Waiter& waiter, absl::Status* refused);
  // `key` is present with `value`: moves the waiters this completes to `out`. mu_ held.
  void MarkPresentLocked(const std::string& key, const std::string& value,
                         std::vector<Completion>* out);
  // Keys starting with `prefix` were deleted: the waiters that saw them miss them again.
  void MarkDeletedLocked(const std::string& prefix);
  // Removes waiter `id` from every index; returns it.
  Waiter RemoveLocked(WaiterId id);
  static void Deliver(std::vector<Completion> completions);
  static void Deliver(Waiter& waiter, absl::StatusOr<std::string> result);
  void TimerLoop();
  // Protocol step 3c, on the timer thread: one read of every missing key. Unlocks meanwhile.
  void PollLocked(std::unique_lock<std::mutex>& lock);
  // Completes the waiters whose deadline is past `now`. Unlocks to deliver.
  void ExpireLocked(Clock::time_point now, std::unique_lock<std::mutex>& lock);

  const RendezvousStoreOptions options_;
  const std::unique_ptr<RendezvousBackend> backend_;

  mutable std::mutex mu_;
  std::condition_variable timer_cv_;  // Wakes the timer thread.
  std::unordered_map<WaiterId, Waiter> waiters_;
  // Missing key -> the waiters indexed under it.
  std::unordered_map<std::string, std::set<WaiterId>> by_key_;
  // The timer queue: earliest deadline first.
  std::set<std::pair<Clock::time_point, WaiterId>> deadlines_;
  WaiterId next_id_ = 1;
  bool shut_down_ = false;
  bool stop_timer_ = false;
  bool poll_now_ = false;        // KeysChanged() asked for a poll.
  Clock::time_point next_poll_;  // When the next poll is due (while any key is missing).
  std::string last_read_error_;  // The last failed backend read, for deadline messages.
  std::thread timer_;            // Last: started once everything above exists.
};

}  // namespace gradhub::api
