// The waits between the tries of a retry loop: exponential, capped, with jitter, and bounded by
// the loop's deadline. Every retry loop of gradhub (gRPC clients on nodes and in services, the
// database pool's serialization retries) takes its waits from here, so they cannot drift.
//
//   Backoff backoff({.initial = 100ms, .max = 5s});
//   while (true) {
//     status = Call();
//     if (status.ok() || !IsRetryable(status.error_code())) break;
//     std::optional<std::chrono::nanoseconds> wait = backoff.NextBefore(deadline);
//     if (!wait) break;  // the next try would start past the deadline: give up now
//     std::this_thread::sleep_for(*wait);
//   }
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <random>

namespace gradhub {

struct BackoffPolicy {
  // The nominal wait after the first failure; each further failure multiplies it by
  // `multiplier`, up to `max`.
  std::chrono::nanoseconds initial = std::chrono::milliseconds(100);
  std::chrono::nanoseconds max = std::chrono::seconds(5);
  double multiplier = 2.0;
  // Each wait is the nominal one times a random factor in [1 - jitter, 1 + jitter] (gRPC's
  // connection backoff uses 0.2). Clients that failed together (a server restart drops every
  // node's stream at once) then come back spread out instead of in one burst. 0 = none.
  double jitter = 0.2;
};

// Not thread-safe: one per retry loop, used by that loop's thread.
class Backoff {
 public:
  using Clock = std::chrono::steady_clock;

  explicit Backoff(BackoffPolicy policy = {});
  // A fixed jitter sequence, for tests.
  Backoff(BackoffPolicy policy, uint32_t seed);

  // The wait before the next try; the nominal wait grows for the call after.
  std::chrono::nanoseconds Next();
  // Next(), or nullopt when waiting it would end past `deadline`: the caller's time is spent,
  // give up now rather than wake up only to fail.
  std::optional<std::chrono::nanoseconds> NextBefore(Clock::time_point deadline,
                                                     Clock::time_point now = Clock::now());
  // After a success: the next wait is `initial` again.
  void Reset() { nominal_ = policy_.initial; }

  // The nominal wait Next() jitters next (without jitter).
  std::chrono::nanoseconds nominal() const { return nominal_; }
  const BackoffPolicy& policy() const { return policy_; }

 private:
  BackoffPolicy policy_;
  std::chrono::nanoseconds nominal_;
  std::minstd_rand random_;  // small and cheap to seed: jitter needs no better
};

}  // namespace gradhub
