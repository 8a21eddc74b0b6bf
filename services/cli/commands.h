// The commands of `gradhub`, one function each. Each declares its own flags on the
// Invocation, calls one or a few RPCs, and prints through output.h; the table below is what
// `gradhub --help` lists and what cli.cc dispatches on.
#pragma once

#include <string>
#include <vector>

#include "services/cli/invocation.h"

namespace gradhub::cli {

struct Command {
  // The command words: "submit", or a group and a subcommand ("nodes cordon").
  std::string name;
  // What follows the command words in its usage line.
  std::string synopsis;
  std::string summary;
  int (*run)(Invocation& invocation);
};

// In the order `gradhub --help` lists them.
const std::vector<Command>& AllCommands();

// JOB as users type it: `jobs/<uuid>` or the bare uuid. Empty for anything else (such as
// `nodes/x`), a usage error.
std::string JobName(const std::string& arg);

// The ListJobs / ListNodes filter for the given --state and --label k=v values, e.g.
// `state=RUNNING AND labels.team="vision"`. Label values are always quoted so that spaces
// survive; a value containing '"' cannot be written in the filter grammar and is an error.
absl::StatusOr<std::string> BuildFilter(
    const std::vector<std::pair<std::string, std::string>>& fields,
    const std::vector<std::string>& labels);

}  // namespace gradhub::cli
