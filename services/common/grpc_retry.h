// The retry policy of every gradhub gRPC client (the agent's calls, log shipping and
// assignment watch, the trainer's checkpoint and telemetry clients, the CLI's download): which
// answers are worth the same call again later, and how long to wait between tries (backoff.h). A
// client adds only what its own protocol says on top (the checkpoint client starts an upload over
// after DATA_LOSS), never a list of codes of its own.
#pragma once

#include <grpcpp/support/status.h>

#include <chrono>

#include "services/common/backoff.h"

namespace gradhub {

// Whether a call that failed with `code` met trouble on the way or at a busy server, so that
// the same call may succeed later:
//
//   UNAVAILABLE, DEADLINE_EXCEEDED, CANCELLED, UNKNOWN, INTERNAL: the server is down, restarting
//     or slow, or the connection broke (a reset stream comes as UNKNOWN or INTERNAL, a server
//     shutting down cancels its calls).
//   RESOURCE_EXHAUSTED, ABORTED: the server is busy (transfer slots, a serialization conflict).
//
// What a person at a terminal retries (the CLI resumes a broken download once): a refused token
// is theirs to fix, and they see it at once.
bool IsTransient(grpc::StatusCode code);

// What the node's clients retry (agent, trainer): IsTransient, and also UNAUTHENTICATED,
// deliberately. A node's token is the one its agent registered with, so a refusal means the
// server side changed, not the client: a token rotated (the new row not yet visible to the
// replica that answered, the old one revoked a moment early), or a server restarted with
// another admin token. The node cannot fix that itself and an operator can, within the
// caller's deadline; failing a training job over it would lose work that a wait keeps (the
// agent likewise keeps its ranks running through refused heartbeats, up to
// --api-outage-grace). A token that is simply wrong still surfaces: every retry is logged with
// its code, and the caller's deadline ends the loop.
//
// Everything else is final: INVALID_ARGUMENT, NOT_FOUND, ALREADY_EXISTS, FAILED_PRECONDITION,
// OUT_OF_RANGE, UNIMPLEMENTED and DATA_LOSS answer the request itself; PERMISSION_DENIED means
// the token is known and not allowed this call, which no wait changes.
bool IsRetryable(grpc::StatusCode code);
inline bool IsRetryable(const grpc::Status& status) {
  return !status.ok() && IsRetryable(status.error_code());
}

// The waits of gradhub's gRPC clients: 100 ms doubling to 5 s, +-20% jitter. Short next to a
// node's lease, so a restarted server sees its clients back within seconds.
inline constexpr BackoffPolicy kGrpcBackoff{.initial = std::chrono::milliseconds(100),
                                            .max = std::chrono::seconds(5),
                                            .multiplier = 2.0,
                                            .jitter = 0.2};

}  // namespace gradhub
