// What a failed Gloo transfer says: the reason part of its CommError, shared by the
// collectives and the point-to-point transfers of GlooProcessGroup so that both word a
// timeout or a dead peer alike.
#pragma once

#include <chrono>
#include <exception>
#include <string>

namespace gradhub::ddp {

// From what a transfer threw: "timed out after <timeout> ms (<gloo's words>)", "peer closed
// the connection (...)", "I/O error (...)", "gloo check failed (...)", or the exception's
// own message. Pure; thread-safe.
std::string GlooFailureReason(std::exception_ptr error, std::chrono::milliseconds timeout);

}  // namespace gradhub::ddp
