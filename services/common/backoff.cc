#include "services/common/backoff.h"

#include <algorithm>

namespace gradhub {

Backoff::Backoff(BackoffPolicy policy) : Backoff(policy, std::random_device{}()) {}

Backoff::Backoff(BackoffPolicy policy, uint32_t seed)
    : policy_(policy), nominal_(policy.initial), random_(seed) {}

std::chrono::nanoseconds Backoff::Next() {
  const double jitter = std::clamp(policy_.jitter, 0.0, 1.0);
  std::uniform_real_distribution<double> factor(1.0 - jitter, 1.0 + jitter);
  const auto wait = std::chrono::duration_cast<std::chrono::nanoseconds>(
      std::chrono::duration<double, std::nano>(nominal_.count() * factor(random_)));
  const auto grown = std::chrono::duration_cast<std::chrono::nanoseconds>(
      std::chrono::duration<double, std::nano>(nominal_.count() * policy_.multiplier));
  nominal_ = std::min(std::max(grown, policy_.initial), policy_.max);
  return wait;
}

std::optional<std::chrono::nanoseconds> Backoff::NextBefore(Clock::time_point deadline,
                                                            Clock::time_point now) {
  const std::chrono::nanoseconds wait = Next();
  if (now + wait > deadline) return std::nullopt;
  return wait;
}

}  // namespace gradhub
