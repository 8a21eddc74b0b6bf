// The exit codes of `gradhub`, the contract a script relies on. They are listed in
// `gradhub --help` from kExitCodesHelp below, so the list and the code cannot drift apart.
#pragma once

#include <grpcpp/support/status.h>

#include <string>

namespace gradhub::cli {

enum ExitCode : int {
  kOk = 0,
  // Anything not listed below: a server error (INTERNAL, UNIMPLEMENTED, ...) or a local fault.
  kInternal = 1,
  // Bad flags or arguments: nothing was sent to the server.
  kUsage = 2,
  kNotFound = 3,
  // The server's INVALID_ARGUMENT, or a spec file that does not parse.
  kInvalidArgument = 4,
  // UNAUTHENTICATED or PERMISSION_DENIED: a missing, wrong or revoked token, or the wrong kind.
  kAuth = 5,
  // UNAVAILABLE or DEADLINE_EXCEEDED: worth retrying later.
  kUnavailable = 6,
  // FAILED_PRECONDITION, ALREADY_EXISTS or ABORTED: the request conflicts with current state.
  kConflict = 7,
  // `watch` and `submit --watch` only: how the job ended (SUCCEEDED is kOk).
  kJobFailed = 8,
  kJobCancelled = 9,
};

// The exit code a failed call ends the command with.
ExitCode ExitCodeFor(grpc::StatusCode code);

// "NOT_FOUND", "UNAVAILABLE", ... as in the gRPC documentation and in error lines.
std::string StatusCodeName(grpc::StatusCode code);

inline constexpr char kExitCodesHelp[] =
    "Exit codes:\n"
    "  0  ok (watch: the job SUCCEEDED)\n"
    "  1  internal or unexpected error\n"
    "  2  usage: bad flags or arguments\n"
    "  3  not found\n"
    "  4  invalid argument (from the server, or a spec file that does not parse)\n"
    "  5  unauthenticated or permission denied\n"
    "  6  server unavailable or deadline exceeded\n"
    "  7  failed precondition, already exists or aborted\n"
    "  8  watch: the job FAILED\n"
    "  9  watch: the job was CANCELLED\n";

}  // namespace gradhub::cli
