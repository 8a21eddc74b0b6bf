#include "services/cli/cli.h"

#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "services/cli/client_config.h"
#include "services/cli/commands.h"

namespace gradhub::cli {
namespace {

// Commands that are a group word plus a subcommand ("nodes cordon").
const std::set<std::string>& Groups() {
  static const auto* const kGroups =
      new std::set<std::string>{"nodes", "admin", "checkpoints", "code", "cluster"};
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

// What comes before the command words: global flags, handed on to the command, whose flag set
// includes them (so they may equally come after it), and --help.
struct LeadingArgs {
  std::vector<std::string> flags;
  bool help = false;
  size_t next = 0;  // the first command word
};

// INVALID_ARGUMENT with the usage message for a flag that is not global or lacks its value.
absl::StatusOr<LeadingArgs> ReadLeadingArgs(const std::vector<std::string>& args) {
  LeadingArgs leading;
  size_t& i = leading.next;
  for (; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--help" || arg == "-h") {
      leading.help = true;
      continue;
    }
    if (arg.size() < 2 || arg[0] != '-') break;
    const std::string name = arg.rfind("--", 0) == 0 ? arg.substr(2, arg.find('=') - 2) : arg;
    if (!IsGlobalFlagWithValue(name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown flag ", arg, " before the command (command flags follow it)"));
    }
    leading.flags.push_back(arg);
    if (arg.find('=') == std::string::npos) {
      if (i + 1 == args.size()) {
        return absl::InvalidArgumentError(absl::StrCat("flag ", arg, " needs a value"));
      }
      leading.flags.push_back(args[++i]);
    }
  }
  return leading;
}

// A group word ("nodes", "admin") at args[*i - 1] made into the command's full name in *name:
// with its subcommand ("nodes cordon"), or `gradhub nodes [flags]` as "nodes list". Otherwise
// the exit code: the group's commands shown for --help, or a usage error.
std::optional<int> GroupCommand(const std::vector<std::string>& args, bool help, Io io,
                                std::string* name, size_t* i) {
  const bool more = *i < args.size();
  if (more && !args[*i].empty() && args[*i][0] != '-') {
    *name += " " + args[(*i)++];
    return std::nullopt;
  }
  const bool asks_help = help || (more && (args[*i] == "--help" || args[*i] == "-h"));
  if (*name == "nodes" && !asks_help) {
    *name = "nodes list";
    return std::nullopt;
  }
  // `gradhub admin --help`, `gradhub nodes --help`: what the group has.
  if (help || more) {
    *io.out << Usage(*name);
    return kOk;
  }
  *io.err << CommandList(*name);
  return UsageError(io, absl::StrCat("'", *name, "' needs a command"));
}

}  // namespace

int RunCli(int argc, const char* const* argv, Io io) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  absl::StatusOr<LeadingArgs> leading = ReadLeadingArgs(args);
  if (!leading.ok()) return UsageError(io, std::string(leading.status().message()));
  bool help = leading->help;
  size_t i = leading->next;
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
    if (std::optional<int> exit = GroupCommand(args, help, io, &name, &i)) return *exit;
  }
  const Command* command = Find(name);
  if (command == nullptr) return UsageError(io, absl::StrCat("unknown command '", name, "'"));
  std::vector<std::string> rest = std::move(leading->flags);
  rest.insert(rest.end(), args.begin() + i, args.end());
  if (help) rest.push_back("--help");
  Invocation invocation(command->name, command->synopsis, command->summary, std::move(rest), io);
  return command->run(invocation);
}

}  // namespace gradhub::cli
