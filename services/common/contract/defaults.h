// Defaults that more than one process relies on, named once. A process that offers a flag for
// one of them uses the constant as the flag's default; a rule that assumes one cites it.
#pragma once

#include <chrono>
#include <cstdint>

namespace gradhub::defaults {

// JobSpec.hangTimeoutSeconds when the spec leaves it 0: the scheduler's watchdog fails an
// attempt none of whose ranks finished a step for this long.
inline constexpr int32_t kHangTimeoutSeconds = 600;

// gradhub-trainer --collective-timeout: a collective that does not complete in this time fails
// the rank (the engine's process groups abort on it).
inline constexpr std::chrono::seconds kCollectiveTimeout{60};

// gradhub-api --heartbeat-interval, announced to agents at registration.
inline constexpr std::chrono::seconds kHeartbeatInterval{1};

// A node that has not heartbeated for this many intervals is LOST (its lease).
inline constexpr int32_t kLeaseHeartbeats = 3;

// gradhub-agent --api-outage-grace: ranks keep running this long without a successful
// heartbeat (the api restarting), then the agent stops them.
inline constexpr std::chrono::seconds kApiOutageGrace{60};

}  // namespace gradhub::defaults
