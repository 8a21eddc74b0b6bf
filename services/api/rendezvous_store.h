// The rendezvous store behind StoreService (proto/gradhub/v1/store.proto): an in-memory
// key-value store with the semantics of PyTorch c10d's TCPStore, and the waiters blocked on it.
//
// No gRPC in this interface (STYLE.md "gRPC wiring apart from domain logic"): blocking calls
// take a completion callback instead of blocking a thread, so that the gRPC adapter (the
// asynchronous API on one completion-queue thread, store_service.h) can answer them later, and
// a world-size-256 job whose ranks all wait at once holds 256 small records here, not 256
// server threads.
//
// Protocol of a blocking call (Get / Wait):
//   1. The arguments are checked; an invalid one completes the call at once.
//   2. When every key is present the call completes at once (inline, before Get/Wait return).
//   3. Otherwise a waiter is recorded under each missing key and in a deadline-ordered queue,
//      and Get/Wait return its id.
//   4. The waiter is completed by exactly one of:
//        - the Set/Add that makes its last missing key present (OK, with the value for Get);
//        - the timer thread at its deadline (DEADLINE_EXCEEDED naming the keys still missing);
//        - CancelWait(id) (CANCELLED), which the adapter calls when the client cancels;
//        - Shutdown() (UNAVAILABLE), so that a server shutdown is not held up by waiters.
//   The completion callback runs exactly once, never with the store's lock held, on the
//   thread that completed it (the caller of Get/Wait, Set, Add, CancelWait or Shutdown, or
//   the timer thread). It must be quick and must not block on the store's own waiters; it
//   may call back into the store.
//
// Keys: plain byte strings compared as such. Unless `require_attempt_scope` is off, every key
// must lie inside one attempt's prefix `jobs/{job_id}/attempts/{attempt}/` (job_id one
// non-empty path segment, attempt decimal digits) and go on after it; DeletePrefix's prefix
// must start with such a prefix. DeletePrefix is a plain string prefix match: the prefix
// `jobs/a/attempts/1/` does not touch `jobs/a/attempts/10/x`, but a prefix without the
// trailing slash would, which is why the scope rule asks for the full attempt prefix.
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
#include <map>
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

  explicit RendezvousStore(RendezvousStoreOptions options = {});
  // Shuts down (pending waiters complete with UNAVAILABLE) and joins the timer thread.
  ~RendezvousStore();
  RendezvousStore(const RendezvousStore&) = delete;
  RendezvousStore& operator=(const RendezvousStore&) = delete;

  // Creates or overwrites `key`, completing every waiter this makes whole.
  absl::Status Set(const std::string& key, std::string value);

  // Atomic counter. Creates `key` at 0 if absent, adds `delta`, stores the result as decimal
  // text and returns it. FAILED_PRECONDITION when the key holds anything but a decimal int64
  // (the operation is fine, the state of the key is not); OUT_OF_RANGE on overflow.
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta);

  // Whether all `keys` are present now.
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

  // Completes every pending waiter with UNAVAILABLE; later Get/Wait complete at once with
  // UNAVAILABLE. Set/Add/Check/DeletePrefix keep working (they never block). Idempotent.
  void Shutdown();

  // Waiters registered and not yet completed, for tests and metrics. A waiter leaves the count
  // when it is completed, just before (not after) its callback runs.
  size_t pending_waiters() const;
  // Keys stored, for tests and metrics.
  size_t size() const;

  // The timeout a blocking call with `requested` gets: the default for <= 0, capped.
  absl::Duration EffectiveTimeout(absl::Duration requested) const;

  const RendezvousStoreOptions& options() const { return options_; }

 private:
  using Clock = std::chrono::steady_clock;

  struct Waiter {
    std::vector<std::string> keys;  // Distinct, in request order.
    size_t missing = 0;             // Keys under which this waiter is indexed in by_key_.
    bool want_value = false;        // Get: complete with the value of keys[0].
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
  WaiterId Register(Waiter waiter);
  // Called with mu_ held after `key` became present: moves the waiters it completes to `out`.
  void OnKeyPresentLocked(const std::string& key, std::vector<Completion>* out);
  // Removes waiter `id` from every index; returns it.
  Waiter RemoveLocked(WaiterId id);
  std::vector<std::string> MissingKeysLocked(const Waiter& waiter) const;
  static void Deliver(std::vector<Completion> completions);
  static void Deliver(Waiter& waiter, absl::StatusOr<std::string> result);
  void TimerLoop();

  const RendezvousStoreOptions options_;

  mutable std::mutex mu_;
  std::condition_variable timer_cv_;         // Wakes the timer thread.
  std::map<std::string, std::string> data_;  // Ordered for DeletePrefix ranges.
  std::unordered_map<WaiterId, Waiter> waiters_;
  // Missing key -> the waiters indexed under it.
  std::unordered_map<std::string, std::set<WaiterId>> by_key_;
  // The timer queue: earliest deadline first.
  std::set<std::pair<Clock::time_point, WaiterId>> deadlines_;
  WaiterId next_id_ = 1;
  bool shut_down_ = false;
  bool stop_timer_ = false;
  std::thread timer_;  // Last: started once everything above exists.
};

}  // namespace gradhub::api
