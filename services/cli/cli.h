// `gradhub` as a function: finds the command words after the global flags, and runs the
// command with the rest. main() only supplies argv and the standard streams.
#pragma once

#include "services/cli/invocation.h"

namespace gradhub::cli {

// Returns the process exit code (exit_codes.h).
int RunCli(int argc, const char* const* argv, Io io);

}  // namespace gradhub::cli
