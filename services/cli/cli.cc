#include "services/cli/cli.h"

#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "services/cli/client_config.h"
#include "services/cli/commands.h"

namespace gradhub::cli {
namespace {

// Commands that are a group word plus a subcommand ("nodes cordon").
const std::set<std::string>& Groups() {
  static const auto* const kGroups =
      new std::set<std::string>{"nodes", "admin", "checkpoints", "cluster"};
  return *kGroups;
}

const Command* Find(const std::string& name) {
  for (const Command& command : AllCommands()) {
    if (command.name == name) return &command;
  }
  return nullptr;
}

// The command list, for `gradhub --help` (group = "") or `gradhub nodes --help`.
std::string CommandList(const std::string& group) {
  std::string out = "Commands:\n";
  for (const Command& command : AllCommands()) {
    if (!group.empty() && command.name.rfind(group + " ", 0) != 0) continue;
    absl::StrAppendFormat(&out, "  %s %s\n      %s\n", command.name, command.synopsis,
                          command.summary);
  }
  return out;
}

std::string Usage(const std::string& group) {
  GlobalOptions globals;
  Flags flags("gradhub",
              absl::StrCat("gradhub: the command-line client of gradhub, training as a service.\n\n"
                           "Usage: gradhub [--server HOST:PORT] [--token T] [--output text|json] ",
                           group.empty() ? "COMMAND" : group + " COMMAND", " [ARGS]\n\n",
                           CommandList(group),
                           "\nJOB is jobs/<id> or the bare <id>; NODE is nodes/<name> or <name>.\n"
                           "Global flags may also follow the command. "
                           "`gradhub COMMAND --help` shows a command's flags.\n"
                           "Between a variable and the default comes the client config, ",
                           ClientConfigPath(),
                           " ($GRADHUB_CONFIG), which `gradhub cluster up` writes: its keys "
                           "server, checkpoint-server, token and tls-ca."));
  globals.Register(flags);
  return absl::StrCat(flags.Usage(), "\n", kExitCodesHelp);
}

int UsageError(Io io, const std::string& message) {
  *io.err << "gradhub: USAGE: " << message << " (see gradhub --help)\n";
  return kUsage;
}

}  // namespace

int RunCli(int argc, const char* const* argv, Io io) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  // Global flags may come before the command words; they are handed to the command, whose
  // flag set includes them, so they may equally come after.
  std::vector<std::string> rest;
  bool help = false;
  size_t i = 0;
  for (; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--help" || arg == "-h") {
      help = true;
      continue;
    }
    if (arg.size() < 2 || arg[0] != '-') break;
    const std::string name = arg.rfind("--", 0) == 0 ? arg.substr(2, arg.find('=') - 2) : arg;
    if (!IsGlobalFlagWithValue(name)) {
      return UsageError(
          io, absl::StrCat("unknown flag ", arg, " before the command (command flags follow it)"));
    }
    rest.push_back(arg);
    if (arg.find('=') == std::string::npos) {
      if (i + 1 == args.size()) return UsageError(io, absl::StrCat("flag ", arg, " needs a value"));
      rest.push_back(args[++i]);
    }
  }
  if (i == args.size() || args[i] == "help") {
    // `gradhub help COMMAND` is `gradhub COMMAND --help`.
    if (i + 1 < args.size() && args[i] == "help") {
      help = true;
      ++i;
    } else if (help || i < args.size()) {
      *io.out << Usage("");
      return kOk;
    } else {
      return UsageError(io, "no command given");
    }
  }

  std::string name = args[i++];
  if (Groups().count(name) > 0) {
    const bool has_subcommand = i < args.size() && !args[i].empty() && args[i][0] != '-';
    if (has_subcommand) {
      name += " " + args[i++];
    } else if (name == "nodes" && !help &&
               (i == args.size() || (args[i] != "--help" && args[i] != "-h"))) {
      name = "nodes list";  // `gradhub nodes [flags]`
    } else {
      // `gradhub admin --help`, `gradhub nodes --help`: what the group has.
      if (help || i < args.size()) {
        *io.out << Usage(name);
        return kOk;
      }
      *io.err << CommandList(name);
      return UsageError(io, absl::StrCat("'", name, "' needs a command"));
    }
  }
  const Command* command = Find(name);
  if (command == nullptr) return UsageError(io, absl::StrCat("unknown command '", name, "'"));
  rest.insert(rest.end(), args.begin() + i, args.end());
  if (help) rest.push_back("--help");
  Invocation invocation(command->name, command->synopsis, command->summary, std::move(rest), io);
  return command->run(invocation);
}

}  // namespace gradhub::cli
